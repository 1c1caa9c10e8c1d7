"""The committed results folder of the synthetic benchmarks (the time estimates read from it: klalm.tasks.estimates).

    <results>/a5.jsonl  mqar.jsonl  mad.jsonl   one row per finished (cell, seed) (klalm.tasks.units)
    <results>/rates.jsonl                       one row per unit run: device, shape, seconds per step, overhead
    <results>/progress.jsonl                    one row per (cell, seed) of a unit paused at a block's end, per pause:
                                                its step and evaluations so far (klalm.tasks.units.paused_rows)

Rows are only ever appended, one JSON object per line, as each unit finishes, so an interrupted block keeps every
unit it finished. A (cell, seed) with a row is finished and is not run again. Reading a file checks the fields of
every row that its readers index (a row of the wrong shape raises ValueError naming file, line and field).

Nothing here imports torch: `klalm-synthetic merge` reads and appends these files without it (klalm.tasks.folders).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from klalm.tasks.cells import CELL_FIELDS, FAMILY_NAMES, Unit, row_key

RATES_FILE = "rates.jsonl"
PROGRESS_FILE = "progress.jsonl"
EVAL_COLUMNS = {"token_acc": 2, "seq_acc": 3}  # where `compact_evals` puts each accuracy


def compact_evals(evals: list[dict[str, float]]) -> list[list[float]]:
    """A seed's evaluations as [step, loss, token accuracy, sequence accuracy] lists (result and progress rows)."""
    return [[e["step"], round(e["loss"], 5), e["token_acc"], e["seq_acc"]] for e in evals]


_Kind = tuple[Callable[[Any], bool], str]  # a field's test and what it must be


def _or_null(kind: _Kind) -> _Kind:
    return (lambda v: v is None or kind[0](v)), f"{kind[1]} or null"


_TEXT: _Kind = (lambda v: isinstance(v, str)), "a string"
_OBJECT: _Kind = (lambda v: isinstance(v, dict)), "a JSON object"
_COUNT: _Kind = (lambda v: type(v) is int and v >= 0), "an integer >= 0"
_SIZE: _Kind = (lambda v: type(v) is int and v >= 1), "an integer >= 1"
_FRACTION: _Kind = (lambda v: type(v) in (int, float) and 0 <= v <= 1), "a number in [0, 1]"
_SECONDS: _Kind = (lambda v: type(v) in (int, float) and 0 <= v < math.inf), "a finite number of seconds >= 0"
_EVALS: _Kind = (lambda v: isinstance(v, list) and all(isinstance(e, list) and len(e) == 4 for e in v),
                "a list of [step, loss, token acc, seq acc] lists")  # fmt: skip
_ACCS: _Kind = (lambda v: isinstance(v, list) and all(a is None or _FRACTION[0](a) for a in v),
               "a list of numbers in [0, 1] or nulls")  # fmt: skip

# The fields the readers index (row_key, report, curves, positions, estimate_s), each row's own and those checked
# only where a row has them. A row of the wrong shape is refused where it is read, naming its file and line, instead
# of a KeyError in the middle of a report or a merge that appends it.
_CELL: dict[str, _Kind] = {
    **dict.fromkeys(CELL_FIELDS, ((lambda v: True), "")),  # row_key's fields, a new one included
    "family": _TEXT, "task": _OBJECT, "arch": _TEXT, "n_layers": _SIZE, "d_model": _SIZE, "model_overrides": _OBJECT,
    "train": _OBJECT, "num_test": _COUNT, "num_train": _or_null(_COUNT), "aux_task": _or_null(_OBJECT),
    "eval_every": _or_null(_SIZE), "stop": _or_null(_OBJECT), "seed": _COUNT, "steps": _COUNT,
}  # fmt: skip
_RESULT_FIELDS = {**_CELL, "token_acc": _FRACTION, "seq_acc": _FRACTION}
_PROGRESS_FIELDS = {**_CELL, "token_acc": _or_null(_FRACTION), "seq_acc": _or_null(_FRACTION), "evals": _EVALS}
_RATE_FIELDS = {
    "device": _TEXT, "family": _TEXT, "arch": _TEXT, "n_layers": _SIZE, "d_model": _SIZE, "members": _SIZE,
    "procs_per_gpu": _SIZE, "tokens_per_step": _SIZE, "step_s": _SECONDS, "overhead_s": _SECONDS, "ended": _TEXT,
}  # fmt: skip
_OPTIONAL_FIELDS = {"planned_steps": _COUNT, "ended": _TEXT, "evals": _EVALS, "position_acc": _or_null(_ACCS),
                    "kla_d_state": _or_null(_SIZE), "compile_backend": _or_null(_TEXT)}  # fmt: skip


def _row_problem(row: Any, path: Path) -> str | None:
    """What is wrong with a row of the results file `path` (see the fields above), or None. A family file's rows
    (a5.jsonl, ...; any other name, as merge reads it) must be of that family."""
    if not isinstance(row, dict):
        return f"not a JSON object: {json.dumps(row)[:60]}"
    fields = {RATES_FILE: _RATE_FIELDS, PROGRESS_FILE: _PROGRESS_FIELDS}.get(path.name, _RESULT_FIELDS)
    missing = [name for name in fields if name not in row]
    if missing:
        return f"missing {', '.join(missing)}"
    for name, (fits, what) in {**_OPTIONAL_FIELDS, **fields}.items():
        if name in row and not fits(row[name]):
            return f"{name}={json.dumps(row[name])[:60]} must be {what}"
    if fields is _RESULT_FIELDS and row["family"] != path.stem:
        return f"family={json.dumps(row['family'])}: a row of {path.name} must be of family {path.stem!r}"
    return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a results file ([] if it does not exist); a line that is not JSON, or a row without the fields
    its readers index (`_row_problem`), raises ValueError naming file and line."""
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not a JSON row ({err.msg})") from err
        problem = _row_problem(row, path)
        if problem:
            raise ValueError(f"{path}:{number}: {problem}")
        rows.append(row)
    return rows


def append_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows as JSON lines in one write call, so a process killed meanwhile leaves no half line behind; after a
    last line without its newline (an editor's save, a copy made with `head -c`) on a line of their own."""
    data = "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if os.lseek(fd, 0, os.SEEK_END) > 0:
            os.lseek(fd, -1, os.SEEK_END)
            if os.read(fd, 1) != b"\n":  # else the first new row would join that line, and neither would read again
                data = b"\n" + data
        written = os.write(fd, data)
        while written < len(data):  # a regular file takes it in one go; this only guards the rare short write
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)


def family_file(folder: Path, family: str) -> Path:
    return folder / f"{family}.jsonl"


RESULTS_FILES = (*(f"{family}.jsonl" for family in FAMILY_NAMES), RATES_FILE, PROGRESS_FILE)


def is_results_folder(folder: Path) -> bool:
    """Whether `folder` is a results folder: one that holds a results file (`RESULTS_FILES`), or an empty one (made
    for a first merge, before any row: scripts/device_synthetic.sh's `$OUT/synthetic` without committed rows)."""
    return any((folder / name).is_file() for name in RESULTS_FILES) or not any(folder.iterdir())


@dataclasses.dataclass
class UnitOutcome:
    """Rows of a finished unit (none when it paused at the deadline) and the rate it measured."""

    rows: list[dict[str, Any]]
    rate: dict[str, Any]


class Results:
    """The rows and rates of one results folder; `record` appends a unit's outcome (thread-safe).

    Args:
        folder: the results folder (created when missing, unless `create` is False: then a missing one reads as empty
            and must exist before anything is recorded).
        families: the families whose rows are read.
        create: create a missing folder.
    """

    def __init__(self, folder: Path, families: list[str], create: bool = True) -> None:
        self.folder = folder
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        self.rows = {family: read_jsonl(family_file(folder, family)) for family in families}
        self.rates = read_jsonl(folder / RATES_FILE)
        self.progress = read_jsonl(folder / PROGRESS_FILE)
        self.keys = {row_key(row) for rows in self.rows.values() for row in rows}
        self._lock = threading.Lock()

    def finished(self, unit: Unit, seed: int) -> bool:
        return unit.key(seed) in self.keys

    def record(self, outcome: UnitOutcome) -> None:
        """Append the rows and the rate of one unit."""
        with self._lock:
            families = dict.fromkeys(row["family"] for row in outcome.rows)
            for family in families:
                rows = [row for row in outcome.rows if row["family"] == family]
                append_lines(family_file(self.folder, family), rows)
                self.rows.setdefault(family, []).extend(rows)
                self.keys.update(row_key(row) for row in rows)
            append_lines(self.folder / RATES_FILE, [outcome.rate])
            self.rates.append(outcome.rate)

    def record_progress(self, rows: list[dict[str, Any]]) -> int:
        """Append the progress rows (`units.paused_rows`) not recorded yet, by (cell, seed, step); returns how many."""
        with self._lock:
            known = {progress_key(r) for r in self.progress}
            new = [r for r in rows if progress_key(r) not in known]
            if new:
                append_lines(self.folder / PROGRESS_FILE, new)
                self.progress.extend(new)
            return len(new)


def progress_key(row: dict[str, Any]) -> str:
    """A progress row's identity: its (cell, seed) and the step it paused at."""
    return f"{row_key(row)}@{row['steps']}"


def merge(source: Path, folder: Path, commit: str) -> dict[str, int]:
    """Append to `folder` the rows and rates of `source` (a results folder from another machine) it lacks.

    Rows whose commit is "unknown" get `commit`; a row `source` holds twice is appended once. Returns the number of
    new lines per file. Every file of both folders is read before any is appended to, so a file that is not JSON lines
    (ValueError) leaves `folder` as it was.
    """
    added: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(source.glob("*.jsonl")):
        mine = read_jsonl(folder / path.name)
        key = {RATES_FILE: _rate_key, PROGRESS_FILE: progress_key}.get(path.name, row_key)
        known = {key(r) for r in mine}
        new = []
        for row in read_jsonl(path):  # a row twice in `source` (two runs into it, files joined) is appended once
            if key(row) not in known:
                known.add(key(row))
                new.append(row)
        for row in new:
            run = row.get("run", row)  # result rows keep the commit in "run"; rates and progress rows at the top
            if run.get("commit") == "unknown":
                run["commit"] = commit
        added[path.name] = new
    for name, new in added.items():
        if new:
            append_lines(folder / name, new)
    return {name: len(new) for name, new in added.items()}


def _rate_key(rate: dict[str, Any]) -> str:
    """A rate's identity: everything but the commit (which `merge` may fill in)."""
    return json.dumps({k: v for k, v in rate.items() if k != "commit"}, sort_keys=True)
