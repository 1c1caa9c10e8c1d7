"""The committed results folder of the synthetic benchmarks, and the time estimates made from it.

    <results>/a5.jsonl  mqar.jsonl  mad.jsonl   one row per finished (cell, seed) (klalm.tasks.units)
    <results>/rates.jsonl                       one row per unit run: device, shape, seconds per step, overhead
    <results>/progress.jsonl                    one row per (cell, seed) of a unit paused at a block's end, per pause:
                                                its step and evaluations so far (klalm.tasks.units.paused_rows)

Rows are only ever appended, one JSON object per line, as each unit finishes, so an interrupted block keeps every
unit it finished. A (cell, seed) with a row is finished and is not run again. Reading a file checks the fields of
every row that its readers index (a row of the wrong shape raises ValueError naming file, line and field).

Estimates (`estimate_s`): a unit's seconds are overhead + steps left × seconds per step, each from this device's
rows of rates.jsonl of the same family, arch and width (with none of the family, those of the other families: the
step is the same model's on a similar number of tokens; MAD's first units read MQAR's and A5's), and the log names
the rows:

- seconds per step from points (tokens per step, median seconds per step of the latest three rows at that count, so
  that the runs of older kernels drop out as new runs come): the rows of the unit's own shape
  (depth, seeds side by side, processes per GPU), and, at token counts above the largest of them (at every count,
  for a shape never measured), the other shapes' rows bounded up to the unit's shape (a step never gets faster with
  more layers, seeds or processes): measured × max(1, depth ratio) × max(1, seeds ratio) × max(1, processes
  ratio), the smallest at each count. A bound at a count bounds every smaller count too (a running minimum from the
  top, which leaves measured points as they are), and time never falls as the tokens grow (a running maximum
  from the bottom). Between the counts
  it is interpolated linearly, above the largest it follows the slope of the top two (never downwards), below the
  smallest it is that count's time, so one point alone is taken as flat: right for small, launch-bound steps,
  where the time barely grows with the tokens, and the reason for the other shapes' points above: MQAR's
  (2048, 256) cell at one block takes 25 ms a step, where a flat (64, 4) point of two blocks had said 3 ms. The
  step time of a unit run includes its evaluations (every 1,000 steps in A5: a few per cent).
- overhead (process start, data, build, compilation, capture: what a run spends outside its training loop) is the
  median of the unit runs of the same arch on this device, else of any arch on it (benchmark rows measure no process
  start and are not used), else the plan's prior.

- a KLA d_state never measured (rows record `kla_d_state`) takes the step times of the measured d_states of the
  same kind, each as above, linearly in d_state (the scan's work grows with it, the rest of the step does not):
  interpolated between the nearest measured below and above, along the top two's slope above the largest (never
  downwards), the smallest's time below it; with one d_state measured and the unit's above it, that time scaled
  in proportion to d_state (an upper bound, since the rest of the step does not grow).

- a width never measured (no row of the arch and d_model on this device, in any family) takes the step time of the
  nearest narrower measured width of the arch, each as above, times (d_model / that width)²: the matmuls' work, an
  upper bound where the step is launch-bound; with only wider widths measured, the nearest wider one's time (a
  narrower model is not slower). Before this rule MQAR's attention units at d_model 256 read the plan's prior, 470
  to 3,279 s a unit from the (64, 4) to the (512, 64) cell, though d_model 128 had measured 2.6 ms a step.

With no row of the arch on this device, the plan's prior (tokens per second of one block and one seed) is used.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import statistics
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from klalm.tasks.plans import FAMILY_NAMES, Estimate, kla_default_d_state
from klalm.tasks.units import CELL_FIELDS, Unit, UnitOutcome, row_key

RATES_FILE = "rates.jsonl"
RECENT_RATES = 3  # a shape's step time at a token count: the median of its latest this many rows (module doc)
PROGRESS_FILE = "progress.jsonl"


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


def estimate_s(unit: Unit, rates: list[dict[str, Any]], device: str, procs_per_gpu: int, prior: Estimate,
               steps: int | None = None, *, compile_backend: str | None = None,
               tokens_per_step: int | None = None) -> tuple[float, str]:  # fmt: skip
    """Estimated wall seconds of `unit` on `device` and where they came from (rates.jsonl line numbers, or "prior").

    Args:
        steps: steps still to run (default: all the unit's steps; fewer for a unit resumed from its saved state).
        compile_backend: the torch.compile backend the unit will train with (None: eager). Step times come from
            rates of the same backend, else from eager ones (compiling was measured faster); the overhead
            (compilation included) only from unit runs of the same backend, else the prior's.
        tokens_per_step: tokens of one member's step (default: the unit's; a pack's mean, `units.pack_tokens`).

    Raises:
        KeyError: no measurement and no prior for the unit's arch (estimate.tokens_per_s).
    """
    steps = unit.train.steps if steps is None else steps
    tokens, shape = tokens_per_step or unit.tokens_per_step(), (unit.n_layers, len(unit.seeds), procs_per_gpu)
    backends = [compile_backend] if compile_backend is None else [compile_backend, None]
    widths = [unit.d_model, *_other_widths(rates, device, unit.arch, unit.d_model)]
    by_d_state, source, width = {}, "", unit.d_model
    for width, family, backend in ((w, f, b) for w in widths for f in (unit.family, None) for b in backends):
        by_d_state = _rate_shapes(rates, (device, family, unit.arch, width), backend)
        if by_d_state:
            eager = "eager " if backend != compile_backend else ""
            source = f"{eager}rates.jsonl" + ("" if family else f" (no {unit.family} rows: other families')")
            break
    if not by_d_state:
        if unit.arch not in prior.tokens_per_s:
            raise KeyError(f"estimate.tokens_per_s has no prior for arch {unit.arch!r}; add one to the plan")
        step_s = tokens * unit.n_layers * len(unit.seeds) * procs_per_gpu / prior.tokens_per_s[unit.arch]
        return (prior.overhead_s + steps * step_s) * prior.safety, "prior"
    d_state = unit.kla_d_state() or kla_default_d_state()
    if d_state in by_d_state:
        step_s, how = _step_time(by_d_state[d_state], shape, tokens, source)
    else:
        step_s, how = _d_state_time(by_d_state, d_state, shape, tokens, source)
    if width != unit.d_model:  # no row of the unit's width: another width's, scaled (module doc)
        factor = max(1.0, (unit.d_model / width) ** 2)
        step_s, how = step_s * factor, f"{step_s * factor * 1e3:.2f} ms/step: d_model {width}'s {how} × {factor:g}"
    runs = [r for r in rates if r["device"] == device and r["ended"] != "bench"
            and r.get("compile_backend") == compile_backend]  # fmt: skip
    same_arch = [r["overhead_s"] for r in runs if r["arch"] == unit.arch]
    overheads = same_arch or [r["overhead_s"] for r in runs]
    overhead_s = statistics.median(overheads) if overheads else prior.overhead_s
    where = f"median of {len(overheads)} {unit.arch + ' ' if same_arch else ''}unit runs" if overheads else "prior"
    return (overhead_s + steps * step_s) * prior.safety, f"{how}; overhead {overhead_s:.0f} s ({where})"


Shapes = dict[tuple[int, int, int], list[tuple[int, dict]]]  # (depth, members, procs per GPU) -> (line, rate)s


def _other_widths(rates: list[dict[str, Any]], device: str, arch: str, d_model: int) -> list[int]:
    """The measured widths of `arch` on `device` other than `d_model`, in the order they stand in for it: the
    narrower ones from the nearest down, then the wider ones from the nearest up (module doc)."""
    widths = {r["d_model"] for r in rates if (r["device"], r["arch"]) == (device, arch)} - {d_model}
    return sorted((w for w in widths if w < d_model), reverse=True) + sorted(w for w in widths if w > d_model)


def _rate_shapes(rates: list[dict[str, Any]], kind: tuple, compile_backend: str | None) -> dict[int, Shapes]:
    """KLA d_state -> (depth, members, procs per GPU) -> the (line, rate) pairs of that shape among the rates of
    `kind` (device, family, arch, d_model; family None: every family) and `compile_backend`; rates from before the
    backend or the d_state was recorded ran eager and at the default d_state (as do the archs without a KLA layer)."""
    default = kla_default_d_state()
    device, family, arch, d_model = kind
    by_d_state: dict[int, Shapes] = {}
    for line, r in enumerate(rates, start=1):
        same = (r["device"], r["arch"], r["d_model"]) == (device, arch, d_model) and family in (None, r["family"])
        if same and r.get("compile_backend") == compile_backend:
            shapes = by_d_state.setdefault(r.get("kla_d_state") or default, {})
            shapes.setdefault((r["n_layers"], r["members"], r["procs_per_gpu"]), []).append((line, r))
    return by_d_state


def _d_state_time(by_d_state: dict[int, Shapes], d_state: int, shape: tuple[int, int, int], tokens: int,
                  source: str) -> tuple[float, str]:  # fmt: skip
    """Seconds per step at a d_state never measured, from the measured ones (module doc) and where they came from."""
    known = sorted(by_d_state)
    upper = bisect.bisect_left(known, d_state)
    if upper == 0:
        used = known[:1]
    elif upper < len(known):
        used = known[upper - 1 : upper + 1]
    else:
        used = known[-2:]
    times = [_step_time(by_d_state[d], shape, tokens, source) for d in used]
    if len(used) == 1:  # below the smallest: its time; above the only one: in proportion to d_state
        step_s = times[0][0] * max(1.0, d_state / used[0])
    else:
        (d0, d1), (s0, s1) = used, (times[0][0], times[1][0])
        step_s = s0 + max(0.0, (s1 - s0) / (d1 - d0)) * (d_state - d0)
    parts = " and ".join(f"d_state {d}: {how}" for d, (_, how) in zip(used, times, strict=True))
    return step_s, f"{step_s * 1e3:.2f} ms/step at d_state {d_state}, linear in d_state from {parts}"


def _points(rows: list[tuple[int, dict]]) -> dict[int, tuple[float, list[int]]]:
    """tokens per step -> (median seconds per step, rates.jsonl lines) over the latest RECENT_RATES rows of one shape
    at that count (rows are appended as units run, so older rows may time older kernels)."""
    by_tokens: dict[int, list[tuple[int, float]]] = {}
    for line, r in rows:
        by_tokens.setdefault(r["tokens_per_step"], []).append((line, r["step_s"]))
    latest = {t: runs[-RECENT_RATES:] for t, runs in by_tokens.items()}
    return {t: (statistics.median(s for _, s in runs), [line for line, _ in runs]) for t, runs in latest.items()}


def _step_time(shapes: dict[tuple[int, int, int], list[tuple[int, dict]]], shape: tuple[int, int, int],
               tokens: int, source: str) -> tuple[float, str]:  # fmt: skip
    """Seconds per step of `shape` at `tokens` tokens per step and where they came from (lines of `source`, the
    rates file as the log names it; see the module doc): the
    shape's own points, and above its largest token count (everywhere, for a shape never measured) the other
    shapes' points bounded up to it, the smallest at each count; a bound holds for fewer tokens too, and time never
    falls as the tokens grow."""
    own = _points(shapes.get(shape, []))
    top = max(own, default=-1)
    points = {t: (s, None, lines) for t, (s, lines) in own.items()}
    for key, rows in shapes.items():
        if key == shape:
            continue
        factor = max(1.0, shape[0] / key[0]) * max(1.0, shape[1] / key[1]) * max(1.0, shape[2] / key[2])
        for t, (s, lines) in _points(rows).items():
            if t > top and (t not in points or s * factor < points[t][0]):
                points[t] = (s * factor, key, lines)
    counts = sorted(points)
    times = [points[t][0] for t in counts]
    for i in reversed(range(len(times) - 1)):  # a bound at more tokens also bounds fewer; a measured time stays
        if points[counts[i]][1] is not None:
            times[i] = min(times[i], times[i + 1])
    for i in range(1, len(times)):  # and no count is faster than a smaller one
        times[i] = max(times[i], times[i - 1])
    if len(counts) == 1 or tokens <= counts[0]:
        used, step_s = counts[:1], times[0]
    else:
        upper = min(bisect.bisect_left(counts, tokens), len(counts) - 1)  # >= 1: above the smallest count
        (t0, s0), (t1, s1) = (counts[upper - 1], times[upper - 1]), (counts[upper], times[upper])
        slope = (s1 - s0) / (t1 - t0)
        used, step_s = [t0, t1], s0 + (slope if tokens <= t1 else max(0.0, slope)) * (tokens - t0)
    own_lines = sorted(line for t in used if points[t][1] is None for line in points[t][2])
    parts = [f"from {source} lines {_lines(own_lines)}"] if own_lines else []
    for key in dict.fromkeys(points[t][1] for t in used if points[t][1] is not None):
        lines = sorted(line for t in used if points[t][1] == key for line in points[t][2])
        parts.append(f"bounded from depth {key[0]}, {key[1]} seeds, {key[2]} proc/GPU on {source} lines "
                     f"{_lines(lines)}")  # fmt: skip
    return step_s, f"{step_s * 1e3:.2f} ms/step " + " and ".join(parts)


def _lines(lines: list[int]) -> str:
    return ",".join(map(str, lines))


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
