"""Time estimates of synthetic units, from the rates.jsonl of a results folder (klalm.tasks.results).

`estimate_s`: a unit's seconds are overhead + steps left × seconds per step, each from this device's rows of
rates.jsonl of the same family, arch and width (with none of the family, those of the other families: the step is
the same model's on a similar number of tokens; MAD's first units read MQAR's and A5's), and the log names the rows:

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
import statistics
from typing import Any

from klalm.tasks.cells import Unit
from klalm.tasks.plans import Estimate, kla_default_d_state

RECENT_RATES = 3  # a shape's step time at a token count: the median of its latest this many rows (module doc)


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
