"""The committed results folder of the synthetic benchmarks, and the time estimates made from it.

    <results>/a5.jsonl  mqar.jsonl  mad.jsonl   one row per finished (cell, seed) (klalm.tasks.units)
    <results>/rates.jsonl                       one row per unit run: device, shape, seconds per step, overhead

Rows are only ever appended, one JSON object per line, as each unit finishes, so an interrupted block keeps every
unit it finished. A (cell, seed) with a row is finished and is not run again.

Estimates: a unit's seconds are overhead + steps × seconds per step. Seconds per step come from this device's
measured rates of the same family, arch and width, each turned into an upper bound for the unit at hand under two
assumptions (a step never gets faster with more tokens, layers, seeds side by side or processes per GPU, and never
slower per token with more tokens): bound = measured × max(1, tokens ratio) × max(1, depth ratio) × max(1, seeds
ratio) × max(1, processes ratio); the smallest bound wins. With no measurement, the plan's prior (tokens per second
of one block and one seed) is used.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
from pathlib import Path
from typing import Any

from klalm.tasks.plans import Estimate
from klalm.tasks.units import Unit, UnitOutcome, row_key

RATES_FILE = "rates.jsonl"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file ([] if it does not exist); a bad line raises ValueError naming file and line."""
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not a JSON row ({err.msg})") from err
    return rows


def append_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows as JSON lines in one write call, so a process killed meanwhile leaves no half line behind."""
    data = "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
        while written < len(data):  # a regular file takes it in one go; this only guards the rare short write
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)


def family_file(folder: Path, family: str) -> Path:
    return folder / f"{family}.jsonl"


class Results:
    """The rows and rates of one results folder; `record` appends a unit's outcome (thread-safe).

    Args:
        folder: the results folder (created when missing).
        families: the families whose rows are read.
    """

    def __init__(self, folder: Path, families: list[str]) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.rows = {family: read_jsonl(family_file(folder, family)) for family in families}
        self.rates = read_jsonl(folder / RATES_FILE)
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


def estimate_s(unit: Unit, rates: list[dict[str, Any]], device: str, procs_per_gpu: int,
               prior: Estimate) -> tuple[float, str]:  # fmt: skip
    """Estimated wall seconds of `unit` on `device` and where the rate came from ("measured ..." or "prior").

    Raises:
        KeyError: no measurement and no prior for the unit's arch (estimate.tokens_per_s).
    """
    tokens, seeds = unit.tokens_per_step(), len(unit.seeds)
    same = [
        r
        for r in rates
        if (r["device"], r["family"], r["arch"], r["d_model"]) == (device, unit.family, unit.arch, unit.d_model)
    ]
    if same:
        bounds = [
            r["step_s"]
            * max(1.0, tokens / r["tokens_per_step"])
            * max(1.0, unit.n_layers / r["n_layers"])
            * max(1.0, seeds / r["members"])
            * max(1.0, procs_per_gpu / r["procs_per_gpu"])
            for r in same
        ]
        step_s, overhead_s = min(bounds), statistics.median(r["overhead_s"] for r in same)
        source = f"measured ({len(same)} runs)"
    else:
        if unit.arch not in prior.tokens_per_s:
            raise KeyError(f"estimate.tokens_per_s has no prior for arch {unit.arch!r}; add one to the plan")
        step_s = tokens * unit.n_layers * seeds * procs_per_gpu / prior.tokens_per_s[unit.arch]
        overhead_s, source = prior.overhead_s, "prior"
    return (overhead_s + unit.train.steps * step_s) * prior.safety, source


def merge(source: Path, folder: Path, commit: str) -> dict[str, int]:
    """Append to `folder` the rows and rates of `source` (a results folder from another machine) it lacks.

    Rows whose commit is "unknown" get `commit`. Returns the number of new lines per file.
    """
    added = {}
    for path in sorted(source.glob("*.jsonl")):
        mine = read_jsonl(folder / path.name)
        key = _rate_key if path.name == RATES_FILE else row_key
        known = {key(r) for r in mine}
        new = [r for r in read_jsonl(path) if key(r) not in known]
        for row in new:
            run = row.get("run", row)
            if run.get("commit") == "unknown":
                run["commit"] = commit
        if new:
            append_lines(folder / path.name, new)
        added[path.name] = len(new)
    return added


def _rate_key(rate: dict[str, Any]) -> str:
    """A rate's identity: everything but the commit (which `merge` may fill in)."""
    return json.dumps({k: v for k, v in rate.items() if k != "commit"}, sort_keys=True)
