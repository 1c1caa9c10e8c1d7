"""Tables (Markdown) and plots (PNG) of the synthetic benchmarks, made from a results folder and the plan.

The plan says which (cell, seed)s should exist and the results folder which do, so an unfinished cell is shown as
unfinished, never as a result:

- A5, minimum depth per (arch, length): `d` = some seed of depth d reached the threshold and every shallower depth
  finished all its seeds without; `≤d` = solved at d while a shallower depth is unfinished; `>D` = every planned
  depth up to D finished unsolved; `>k …` = depths up to k finished unsolved and the next is unfinished (`…` when
  k = 0); `not run` = no run of the cell has finished. In brackets the best held-out accuracy of the cell.
  The runs table lists finished runs, and then units paused at a block's end with their step and best accuracy
  so far (progress.jsonl; such a unit may be resumed, or its state may be lost: either way it is unfinished).
- MQAR: best held-out accuracy over learning rates and seeds per (arch, depth, width) and (length, pairs) cell, the
  best lr in brackets, `(k/n)` when only k of the cell's n planned runs have finished.
- MAD: best accuracy over learning rates, weight decays and seeds per task, `(k/n)` likewise.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from klalm.config_checks import A5_CRITERIA
from klalm.fileio import save_figure, write_atomic
from klalm.markdown import fill_sections
from klalm.tasks.cells import Unit, kla_d_state, row_key
from klalm.tasks.plans import RunPlan, plan_units
from klalm.tasks.results import EVAL_COLUMNS, Results

Row = dict[str, Any]
Figure = tuple[Path, str]  # (PNG file to write, its path as the Markdown links it)
# family -> (run rows of each planned unit): unit, {seed: row or None}
Planned = list[tuple[Unit, dict[int, Row | None]]]


def planned(plan: RunPlan, rows: list[Row], family: str) -> Planned:
    index = {row_key(r): r for r in rows}
    return [(u, {s: index.get(u.key(s)) for s in u.seeds}) for u in plan_units(plan) if u.family == family]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _done(runs: dict[int, Row | None]) -> list[Row]:
    return [r for r in runs.values() if r is not None]


@contextlib.contextmanager
def _figure(path: Path, *grid: int, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """A report figure and its axes (`plt.subplots(*grid, **subplots)`) to draw in, laid out and written to `path`
    (PNG, 120 dpi, atomically) when the block ends, and closed however it ends: pyplot keeps a figure that is not
    closed, and one whose drawing failed was left open."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*grid, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)


# ------------------------------------------------------------------------------------------------------------ A5


def a5_grid(plan: RunPlan, rows: list[Row]) -> dict[str, dict[int, dict[int, tuple[int, list[Row]]]]]:
    """arch -> length -> depth -> (planned seeds, finished rows)."""
    grid: dict[str, dict[int, dict[int, tuple[int, list[Row]]]]] = {}
    for unit, runs in planned(plan, rows, "a5"):
        cell = grid.setdefault(unit.arch, {}).setdefault(unit.task["length"], {})
        seeds, done = cell.get(unit.n_layers, (0, []))
        cell[unit.n_layers] = (seeds + len(runs), done + _done(runs))
    return grid


def min_depth(depths: dict[int, tuple[int, list[Row]]], metric: str, threshold: float) -> tuple[str, str]:
    """(text, state) of one (arch, length): state is solved, unsolved, unfinished or open (see the module doc)."""
    lower_complete, highest_unsolved = True, 0
    for depth in sorted(depths):
        seeds, done = depths[depth]
        if any(r[metric] >= threshold for r in done):
            return (str(depth) if lower_complete else f"≤{depth}"), "solved"
        complete = len(done) == seeds
        if complete and lower_complete:
            highest_unsolved = depth
        lower_complete = lower_complete and complete
    if lower_complete:
        return f">{max(depths)}", "unsolved"
    if not any(done for _, done in depths.values()):
        return "not run", "open"
    return (f">{highest_unsolved} …" if highest_unsolved else "…"), "unfinished"


def a5_section(plan: RunPlan, rows: list[Row], figure: Figure | None, progress: list[Row] = ()) -> str:
    """The minimum-depth table, the runs table (with the paused units of `progress`) and the figure."""
    metric, threshold = A5_CRITERIA[plan.a5.criterion], plan.a5.threshold
    grid = a5_grid(plan, rows)
    lengths = sorted({length for per_arch in grid.values() for length in per_arch})
    paused = paused_runs(plan, rows, progress, "a5")
    paused_best: dict[tuple[str, int], float] = {}  # (arch, length) -> best accuracy of its paused seeds so far
    for unit, seen in paused:
        key = (unit.arch, unit.task["length"])
        paused_best[key] = max(_best_so_far(seen, metric), paused_best.get(key, 0.0))
    table, cells = [], {}
    for arch, per_length in grid.items():
        line = [arch]
        for length in lengths:
            if length not in per_length:
                line.append("")
                continue
            text, state = min_depth(per_length[length], metric, threshold)
            done = [r for _, rs in per_length[length].values() for r in rs]
            if state == "open" and (arch, length) in paused_best:
                text, state = f"… (paused: {_pct(paused_best[arch, length])})", "unfinished"
            cells[arch, length] = (text, state)
            line.append(text + (f" ({_pct(max(r[metric] for r in done))})" if done else ""))
        table.append(line)
    criterion = f"{plan.a5.criterion} accuracy ≥ {100 * threshold:.0f} %"
    parts = [
        f"A5, minimum blocks ({criterion}; best accuracy % in brackets):",
        _table(["arch"] + [f"L={n}" for n in lengths], table),
        "A5 runs (finished seeds / planned, seeds that reached the threshold, best accuracies %, reach: the most "
        "leading positions a seed gets right at the threshold, steps):",
        a5_runs_table(grid, metric, threshold, paused),
    ]
    if figure is not None and rows:
        plot_a5(cells, lengths, max(d for a in grid.values() for c in a.values() for d in c), plan, figure[0])
        parts.append(f"![A5 minimum blocks]({figure[1]})")
    return "\n\n".join(parts)


def latest_progress(rows: list[Row], progress: list[Row]) -> dict[str, Row]:
    """row_key -> the progress row recorded last (progress.jsonl is appended in time order) of each (cell, seed) that
    has no finished row: not the one of most steps, since a run whose state was lost starts again from step 0."""
    finished = {row_key(r) for r in rows}
    return {row_key(row): row for row in progress if row_key(row) not in finished}


def paused_runs(plan: RunPlan, rows: list[Row], progress: list[Row], family: str) -> list[tuple[Unit, list[Row]]]:
    """Planned units of `family` with unfinished seeds that have progress rows: the latest row of each such seed."""
    latest = latest_progress(rows, progress)
    out = []
    for unit in plan_units(plan):
        seen = [latest[unit.key(s)] for s in unit.seeds if unit.key(s) in latest]
        if unit.family == family and seen:
            out.append((unit, seen))
    return out


def a5_runs_table(grid: dict, metric: str, threshold: float, paused: list[tuple[Unit, list[Row]]] = ()) -> str:
    lines = []
    for arch, per_length in grid.items():
        for length, per_depth in sorted(per_length.items()):
            for depth, (seeds, done) in sorted(per_depth.items()):
                if not done:
                    continue
                solved = ",".join(str(r["seed"]) for r in done if r[metric] >= threshold) or "none"
                steps = sorted(r["steps"] for r in done)
                lines.append([arch, str(length), str(depth), f"{len(done)}/{seeds}", solved,
                              _pct(max(r["token_acc"] for r in done)), _pct(max(r["seq_acc"] for r in done)),
                              _reach(done, threshold),
                              f"{steps[0]}" if steps[0] == steps[-1] else f"{steps[0]}-{steps[-1]}"])  # fmt: skip
    for unit, seen in paused:
        token, seq = (_pct(_best_so_far(seen, metric)) for metric in EVAL_COLUMNS)
        seeds, done = grid[unit.arch][unit.task["length"]][unit.n_layers]
        lines.append([unit.arch, str(unit.task["length"]), str(unit.n_layers),
                      f"{len(done)}/{seeds}, {len(seen)} paused", "none yet", token, seq, _reach(seen, threshold),
                      f"paused at {min(r['steps'] for r in seen)} of {unit.train.steps}"])  # fmt: skip
    if not lines:
        return "(none finished yet)"
    return _table(["arch", "L", "blocks", "seeds", "solved by", "token acc", "seq acc", "reach", "steps"], lines)


def _best_so_far(progress: list[Row], metric: str) -> float:
    """The best `metric` over every evaluation of these progress rows (0 when they hold none)."""
    return max((e[EVAL_COLUMNS[metric]] for r in progress for e in r["evals"]), default=0.0)


def _reach(rows: list[Row], threshold: float) -> str:
    """The most leading positions that some seed gets right at least `threshold` of the time (its last evaluation),
    "—" when no row records accuracy by position (rows before 2026-12-01's fourth session)."""
    reaches = [next((i for i, a in enumerate(r["position_acc"]) if a is not None and a < threshold),
                    len(r["position_acc"])) for r in rows if r.get("position_acc")]  # fmt: skip
    return str(max(reaches)) if reaches else "—"


BAR_STYLES = {"solved": (None, 1.0), "unsolved": ("//", 0.35), "unfinished": ("..", 0.15), "open": ("..", 0.08)}


def plot_a5(cells: dict, lengths: list[int], deepest: int, plan: RunPlan, path: Path) -> None:
    """Grouped bars per length: solid at the minimum depth, hatched up to "not solved", light where unfinished."""
    from matplotlib.patches import Patch

    archs = list(dict.fromkeys(arch for arch, _ in cells))
    width = 0.8 / max(len(archs), 1)
    size = (min(12.0, max(6.0, 1.5 + len(lengths) * (0.3 + 0.25 * len(archs)))), 4.5)
    with _figure(path, figsize=size) as (_, ax):
        for i, arch in enumerate(archs):
            for j, length in enumerate(lengths):
                if (arch, length) not in cells:
                    continue
                text, state = cells[arch, length]
                x = j + (i - (len(archs) - 1) / 2) * width
                height = int(text.lstrip("≤")) if state == "solved" else deepest + 1
                hatch, alpha = BAR_STYLES[state]
                ax.bar(x, height, width, color=f"C{i}", hatch=hatch, alpha=alpha)
                ax.annotate(text, (x, height + 0.05), ha="center", va="bottom", fontsize=7, rotation=90)
        ax.axhline(deepest + 0.5, color="grey", lw=0.8, ls=":")
        ax.set_xticks(range(len(lengths)), [f"L={n}" for n in lengths])
        ax.set_yticks(range(1, deepest + 2), [*map(str, range(1, deepest + 1)), f"not solved\n(≤ {deepest})"])
        ax.set_ylim(0, deepest + 2.2)
        ax.set(xlabel="sequence length", ylabel="minimum blocks")
        ax.set_title(
            f"A5: fewest blocks reaching {100 * plan.a5.threshold:.0f}% ({plan.a5.criterion} acc)", fontsize=10
        )
        # the legend names the colours (solid, whatever a cell's first bar looks like) and the three bar styles
        handles = [Patch(color=f"C{i}", label=arch) for i, arch in enumerate(archs)]
        handles += [Patch(facecolor="grey", hatch=BAR_STYLES[state][0], alpha=BAR_STYLES[state][1], label=label)
                    for state, label in (("unsolved", "not solved"),
                                         ("unfinished", "unfinished or not run"))]  # fmt: skip
        ax.legend(handles=handles, fontsize=8, ncols=len(handles), loc="upper center", bbox_to_anchor=(0.5, -0.14),
                  frameon=False)  # fmt: skip


# ------------------------------------------------------------------------------------------------------------ MQAR


def best_runs(plan: RunPlan, rows: list[Row], family: str, row_of, column_of, progress: list[Row] = ()) -> dict:
    """(row label, column label) -> (finished rows, planned runs, latest progress rows of paused seeds) over a
    family's planned units."""
    paused = {_unit_id(unit): seen for unit, seen in paused_runs(plan, rows, progress, family)}
    cells: dict[tuple[str, str], tuple[list[Row], int, list[Row]]] = {}
    for unit, runs in planned(plan, rows, family):
        key = (row_of(unit), column_of(unit))
        done, count, seen = cells.get(key, ([], 0, []))
        cells[key] = (done + _done(runs), count + len(runs), seen + paused.get(_unit_id(unit), []))
    return cells


def _unit_id(unit: Unit) -> tuple[str, ...]:
    return tuple(unit.key(seed) for seed in unit.seeds)


def _best_text(done: list[Row], count: int, paused: list[Row], with_lr: bool) -> str:
    """A cell of the MQAR or MAD table: the best finished run (and how many of the planned ones finished), or, with
    none finished, how far its paused seeds got ("not run" when none started)."""
    if not done:
        if not paused:
            return "not run"
        best = _best_so_far(paused, "token_acc")
        so_far = f": {_pct(best)}" if any(r["evals"] for r in paused) else ""
        return f"… (paused at {min(r['steps'] for r in paused)} of {paused[0]['planned_steps']}{so_far})"
    best = max(done, key=lambda r: r["token_acc"])
    notes = [f"lr {best['train']['lr']:g}"] if with_lr else []
    if best.get("ended") == "threshold":  # stopped early by the plan's stop rule (MQAR's 99 %)
        notes.append(f"stopped at {best['steps']:,} steps")
    text = _pct(best["token_acc"]) + (f" ({', '.join(notes)})" if notes else "")
    waiting = f", {len(paused)} paused" if paused else ""
    return text + ("" if len(done) == count else f" ({len(done)}/{count}{waiting})")


def _grid_table(cells: dict, first: str, with_lr: bool) -> str:
    rows_, columns = list(dict.fromkeys(r for r, _ in cells)), list(dict.fromkeys(c for _, c in cells))
    lines = [[r] + [_best_text(*cells[r, c], with_lr=with_lr) if (r, c) in cells else "" for c in columns]
             for r in rows_]  # fmt: skip
    return _table([first, *columns], lines)


def _blocks(n: int) -> str:
    return f"{n} block" + ("s" if n != 1 else "")


def _grid_section(cells: dict, heading: str, first: str, with_lr: bool, name: str, figure: Figure | None,
                  plot: Callable[[dict, str, Path], None] | None = None) -> str:  # fmt: skip
    """The best-run table of MQAR or MAD under `heading`, and its plot (`plot`, default `plot_lines`) when a figure is
    asked for."""
    text = f"{heading}\n\n" + _grid_table(cells, first, with_lr=with_lr)
    if figure is not None:
        (plot or plot_lines)(cells, f"{name}: best held-out accuracy", figure[0])
        text += f"\n\n![{name.split('-')[0]} accuracy]({figure[1]})"
    return text


def mqar_section(plan: RunPlan, rows: list[Row], figure: Figure | None, progress: list[Row] = ()) -> str:
    def model(u: Unit) -> str:
        return f"{u.arch}, {_blocks(u.n_layers)}, d={u.d_model}" + (f", S={u.kla_d_state()}" if u.kla_d_state() else "")

    cells = best_runs(plan, rows, "mqar", model, lambda u: f"L={u.task['length']} K={u.task['num_pairs']}", progress)
    heading = "MQAR, held-out accuracy % at the query positions (best over learning rates and seeds):"
    return _grid_section(cells, heading, "model", True, "MQAR", figure if rows else None)


def _line_points(cells: dict, label: str, columns: list[str]) -> list[float]:
    """A row label's best accuracy % in each column, NaN where it has no finished run: a gap the line breaks at
    rather than a segment drawn across columns that never ran."""
    return [100 * max(r["token_acc"] for r in cells[label, c][0]) if cells.get((label, c), [[]])[0] else math.nan
            for c in columns]  # fmt: skip


def plot_lines(cells: dict, title: str, path: Path) -> None:
    """Accuracy per column (x, categorical) for each row label that has a finished run."""
    labels, columns = list(dict.fromkeys(r for r, _ in cells)), list(dict.fromkeys(c for _, c in cells))
    with _figure(path, figsize=(7, 4)) as (_, ax):
        for label in labels:
            points = _line_points(cells, label, columns)
            if not all(math.isnan(p) for p in points):
                ax.plot(range(len(columns)), points, marker="o", label=label)
        ax.set_xticks(range(len(columns)), columns, rotation=20)
        ax.set(ylabel="accuracy (%)", ylim=(0, 101), title=title)
        ax.legend(fontsize=7)


# ------------------------------------------------------------------------------------------------------------ MAD


def plot_bars(cells: dict, title: str, path: Path) -> None:
    """Accuracy per column as grouped bars, one bar per row label (none where the label has no finished run), for
    columns that do not form a scale (MAD's tasks, which a line would join as if they did); a column with no finished
    run at all is marked "not run"."""
    labels, columns = list(dict.fromkeys(r for r, _ in cells)), list(dict.fromkeys(c for _, c in cells))
    points = {label: _line_points(cells, label, columns) for label in labels}
    width = 0.8 / max(1, len(labels))
    with _figure(path, figsize=(max(7.0, 1.2 * len(columns)), 4)) as (_, ax):
        for i, label in enumerate(labels):  # no bar where a label has no finished run: a missing bar, not a 0 %
            offset = (i - (len(labels) - 1) / 2) * width
            shown = [(x + offset, p) for x, p in enumerate(points[label]) if not math.isnan(p)]
            ax.bar([x for x, _ in shown], [p for _, p in shown], width, label=label, color=f"C{i}")
        for x in range(len(columns)):
            if all(math.isnan(points[label][x]) for label in labels):
                ax.text(x, 2, "not run", ha="center", va="bottom", fontsize=8, color="0.4")
        ax.set_xticks(range(len(columns)), columns, rotation=20)
        ax.set(ylabel="accuracy (%)", ylim=(0, 101), title=title)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the axes: bars reach 100 %


def mad_section(plan: RunPlan, rows: list[Row], figure: Figure | None, progress: list[Row] = ()) -> str:
    cells = best_runs(plan, rows, "mad", lambda u: u.arch, lambda u: u.task["name"].removeprefix("mad_"), progress)
    heading = "MAD-Lab, held-out accuracy % (best over learning rates, weight decays and seeds):"
    return _grid_section(cells, heading, "arch", False, "MAD-Lab", figure if rows else None, plot_bars)


SECTIONS = {"a5": a5_section, "mqar": mqar_section, "mad": mad_section}


def sections(plan: RunPlan, folder: Path, image_dir: Path, link_prefix: str) -> dict[str, str]:
    """family -> Markdown section, for the plan's families; plots go to image_dir/synthetic_<family>.png and are
    linked as link_prefix + that name."""
    if not folder.is_dir():
        raise FileNotFoundError(f"results folder {folder} does not exist")
    results = Results(folder, plan.families)
    out = {}
    for family in plan.families:
        name = f"synthetic_{family}.png"
        figure = (image_dir / name, link_prefix + name)
        out[family] = SECTIONS[family](plan, results.rows[family], figure, results.progress)
    return out


# ---------------------------------------------------------------------------------------- saved units, by position


def run_positions(rows: list[Row], progress: list[Row], family: str, archs: list[str], lengths: list[int],
                  depths: list[int]) -> list[Row]:  # fmt: skip
    """The runs of `training_curves` (finished rows, and paused runs' latest progress rows, `ended` "paused") that
    carry accuracy by position, in the form `units.evaluate_saved` gives paused units (a `unit` label per (arch,
    length, depth), and for MQAR its pairs, width and learning rate), sorted by arch, depth, length (width, lr) and
    seed. A paused run's accuracies are those of its last evaluation."""
    return [r for r in _recorded_runs(rows, progress, family, archs, lengths, depths) if r.get("position_acc")]


def _run_order(row: Row) -> tuple:
    """How tables and plots order runs: arch, depth, length, width, key width (MQAR), learning rate, seed."""
    d_state = kla_d_state(row["model_overrides"]) or 0
    return row["arch"], row["n_layers"], row["task"]["length"], row["d_model"], d_state, row["train"]["lr"], row["seed"]


def run_colours(rows: list[Row]) -> dict[tuple[str, int], str]:
    """(unit label, seed) -> a matplotlib colour, numbered per task cell in the order of `rows`: give the plots of
    one family the rows of `training_curves` (finished and paused runs) so that a run has one colour in all of them,
    whichever runs a plot leaves out."""
    colours: dict[tuple[str, int], str] = {}
    lines: dict[tuple, int] = {}  # lines coloured so far in each cell
    for r in rows:
        cell = tuple(sorted(r["task"].items()))
        colours[r["unit"], r["seed"]] = f"C{lines.get(cell, 0) % 10}"
        lines[cell] = lines.get(cell, 0) + 1
    return colours


def _position_unit(row: Row) -> str:
    label = f"{row['arch']} L={row['task']['length']}"
    if row["task"]["name"] == "mqar":
        d_state = kla_d_state(row["model_overrides"])
        width = f"d={row['d_model']}" + (f" S={d_state}" if d_state is not None else "")
        return f"{label} K={row['task']['num_pairs']} depth={row['n_layers']} {width} lr={row['train']['lr']:g}"
    return f"{label} depth={row['n_layers']}"


POSITION_BINS = 8  # MQAR: its scored positions shown in spans of length/8


def position_bins(row: Row, bins: int = POSITION_BINS) -> list[tuple[int, int, float]]:
    """(first, last position, mean accuracy) of each span [j·L/bins, (j+1)·L/bins) that holds scored positions: the
    mean over the span's scored positions, each counting once however many queries it had (MQAR's queries crowd
    towards their keys, so spans differ in queries)."""
    acc, length = row["position_acc"], len(row["position_acc"])
    spans = []
    for j in range(bins):
        first, end = length * j // bins, length * (j + 1) // bins
        scored = [a for a in acc[first:end] if a is not None]
        if scored:
            spans.append((first, end - 1, sum(scored) / len(scored)))
    return spans


def positions_markdown(rows: list[Row]) -> str:
    """Rows of `units.evaluate_saved` or `run_positions` as a table: accuracies (%) overall and at every
    position, one line per seed (with the accuracy training last recorded, where the rows were re-evaluated); MQAR
    rows as one table per (length, pairs) cell, by spans of positions (`position_bins`)."""
    if rows[0]["task"]["name"] == "mqar":
        return _mqar_positions_markdown(rows)
    width = max(len(r["position_acc"]) for r in rows)
    recorded = all("recorded_token_acc" in r for r in rows)
    lines = []
    for r in rows:
        accs = [_pct(r["recorded_token_acc"] or 0.0)] if recorded else []
        accs += [_pct(r["token_acc"]), _pct(r["seq_acc"])]
        by_position = ["" if a is None else f"{100 * a:.0f}" for a in r["position_acc"]]
        padding = [""] * (width - len(by_position))
        lines.append([r["unit"], str(r["seed"]), _step_text(r), *accs, *by_position, *padding])
    header = ["unit", "seed", "step", *(["token acc (recorded)"] if recorded else []), "token acc", "seq acc",
              *map(str, range(width))]  # fmt: skip
    return _table(header, lines)


def _step_text(row: Row) -> str:
    """The step a row's accuracies were measured at, marked where the run was paused there."""
    return f"{row['steps']} (paused)" if row.get("ended") == "paused" else str(row["steps"])


def _mqar_positions_markdown(rows: list[Row]) -> str:
    tables = []
    for cell in dict.fromkeys((r["task"]["length"], r["task"]["num_pairs"]) for r in rows):
        at_cell = [r for r in rows if (r["task"]["length"], r["task"]["num_pairs"]) == cell]
        binned = [position_bins(r) for r in at_cell]
        lines = [[r["unit"], str(r["seed"]), _step_text(r), _pct(r["token_acc"]), *(_pct(mean) for *_, mean in bins)]
                 for r, bins in zip(at_cell, binned, strict=True)]  # fmt: skip
        header = ["unit", "seed", "step", "token acc", *(f"{first}–{last}" for first, last, _ in binned[0])]
        tables.append(f"MQAR L={cell[0]} K={cell[1]}, held-out accuracy (%) by query position: the mean over each "
                      f"span's scored positions\n\n{_table(header, lines)}")  # fmt: skip
    return "\n\n".join(tables)


def plot_positions(rows: list[Row], path: Path, colours: dict[tuple[str, int], str] | None = None) -> None:
    """Held-out accuracy by position: one panel per A5 length, one colour per arch and one line style per depth;
    each line is a (arch, length, depth) unit's best seed (highest token accuracy, the seed that decides whether the
    cell is solved), the range over its seeds shaded. MQAR rows: `plot_mqar_positions`, one colour per run from
    `colours` (`run_colours`; default: of `rows`)."""
    if rows[0]["task"]["name"] == "mqar":
        return plot_mqar_positions(rows, path, colours or run_colours(rows))

    lengths = sorted({r["task"]["length"] for r in rows})
    colours = {arch: f"C{i}" for i, arch in enumerate(dict.fromkeys(r["arch"] for r in rows))}
    styles = ["-", "--", ":", "-."]
    size = (3.2 * len(lengths) + 1.0, 3.6)
    with _figure(path, 1, len(lengths), figsize=size, sharey=True, squeeze=False) as (fig, axes):
        for ax, length in zip(axes[0], lengths, strict=True):
            at_length = [r for r in rows if r["task"]["length"] == length]
            for arch, depth in dict.fromkeys((r["arch"], r["n_layers"]) for r in at_length):
                seeds = [r for r in at_length if (r["arch"], r["n_layers"]) == (arch, depth)]
                accs = [[100 * (a or 0.0) for a in r["position_acc"]] for r in seeds]
                best = accs[max(range(len(seeds)), key=lambda j: seeds[j]["token_acc"])]
                x = range(len(best))
                paused = sum(r.get("ended") == "paused" for r in seeds)
                ax.plot(x, best, marker="o", ms=2.5, color=colours[arch], ls=styles[(depth - 1) % len(styles)],
                        label=f"{arch}, {depth} block{'s' * (depth > 1)} ({len(seeds)} seeds"
                              f"{f', {paused} paused' if paused else ''})")  # fmt: skip
                ax.fill_between(x, [min(c) for c in zip(*accs, strict=True)], [max(c) for c in zip(*accs, strict=True)],
                                color=colours[arch], alpha=0.12)  # fmt: skip
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.set(title=f"L = {length}", xlabel="position", ylim=(0, 101))
            ax.legend(fontsize=6.5, loc="lower left")
        axes[0][0].set_ylabel("held-out token accuracy (%)")
        fig.suptitle("A5 accuracy by position (line: best seed; shaded: all seeds)", fontsize=10)


def plot_mqar_positions(rows: list[Row], path: Path, colours: dict[tuple[str, int], str]) -> None:
    """MQAR held-out accuracy by query position: one panel per (length, pairs) cell, each run's scored positions as
    faint points and the means of its spans (`position_bins`, 4× finer than the table's) as a line, in its colour."""
    cells = list(dict.fromkeys((r["task"]["length"], r["task"]["num_pairs"]) for r in rows))
    lines = max(sum((r["task"]["length"], r["task"]["num_pairs"]) == cell for r in rows) for cell in cells)
    width, height = max(7.0, 4.6 * len(cells) + 1.0), 3.8 + 0.16 * lines  # room for the legend below the axes
    with _figure(path, 1, len(cells), figsize=(width, height), sharey=True, squeeze=False) as (fig, axes):
        for ax, cell in zip(axes[0], cells, strict=True):
            for r in (r for r in rows if (r["task"]["length"], r["task"]["num_pairs"]) == cell):
                colour = colours[r["unit"], r["seed"]]
                scored = [(t, 100 * a) for t, a in enumerate(r["position_acc"]) if a is not None]
                ax.plot(*zip(*scored, strict=True), ".", ms=2, color=colour, alpha=0.25)
                spans = position_bins(r, 4 * POSITION_BINS)
                paused = r.get("ended") == "paused"  # dashed, as in the curves plot
                label = f"{r['unit']} seed {r['seed']} ({_pct(r['token_acc'])} %{', paused' * paused})"
                ax.plot([(first + last) / 2 for first, last, _ in spans], [100 * mean for _, _, mean in spans],
                        "--" if paused else "-", color=colour, label=label)  # fmt: skip
            ax.set(title=f"L = {cell[0]}, K = {cell[1]}", xlabel="query position", ylim=(0, 101))
            ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)  # below the axes
        axes[0][0].set_ylabel("held-out accuracy (%)")
        fig.suptitle("MQAR accuracy by query position (points: positions; lines: means over spans)", fontsize=10)


# -------------------------------------------------------------------------------------------- accuracy by step


def training_curves(rows: list[Row], progress: list[Row], family: str, archs: list[str], lengths: list[int],
                    depths: list[int]) -> list[Row]:  # fmt: skip
    """Every run of `family` with its evaluations, of the given archs, lengths and depths (empty: all): its finished
    rows, and for each (cell, seed) without one its latest progress row (`ended` "paused"), with a `unit` label and
    sorted by `_run_order`."""
    return [r for r in _recorded_runs(rows, progress, family, archs, lengths, depths) if r.get("evals")]


def _recorded_runs(rows: list[Row], progress: list[Row], family: str, archs: list[str], lengths: list[int],
                   depths: list[int]) -> list[Row]:  # fmt: skip
    """The finished rows of `family` and the latest progress rows of its runs that have none, filtered, labelled
    and sorted for `training_curves` and `run_positions`."""
    paused = [r for r in latest_progress(rows, progress).values() if r["family"] == family]
    kept = [r for r in [*rows, *paused] if (not archs or r["arch"] in archs)
            and (not lengths or r["task"]["length"] in lengths)
            and (not depths or r["n_layers"] in depths)]  # fmt: skip
    kept.sort(key=_run_order)
    return [{**r, "unit": _position_unit(r)} for r in kept]


def accuracy_at(row: Row, step: int) -> float | None:
    """Held-out token accuracy of the run's last evaluation at or before `step`; None past its last evaluation
    (a paused run, or one stopped early) or before its first."""
    column = EVAL_COLUMNS["token_acc"]
    if step > row["evals"][-1][0]:
        return None
    before = [e for e in row["evals"] if e[0] <= step]
    return before[-1][column] if before else None


def curve_steps(rows: list[Row], points: int = 5) -> list[int]:
    """`points` evenly spaced steps up to the longest planned schedule of `rows`."""
    last = max(r["planned_steps"] for r in rows)
    return [last * (i + 1) // points for i in range(points)]


def curves_markdown(rows: list[Row], steps: list[int]) -> str:
    """One line per run: how it ended and its held-out token accuracy (%) at each of `steps` (blank past its last
    evaluation), then at its last evaluation."""
    lines = []
    for r in rows:
        at = [accuracy_at(r, step) for step in steps]
        ended = f"{r['ended']} at {r['steps']}"  # "steps", "threshold" or "paused"
        last_step, last_acc = r["evals"][-1][0], r["evals"][-1][EVAL_COLUMNS["token_acc"]]
        lines.append([r["unit"], str(r["seed"]), ended, *("" if a is None else _pct(a) for a in at),
                      f"{_pct(last_acc)} ({last_step})"])  # fmt: skip
    return _table(["unit", "seed", "ended", *(f"step {step:,}" for step in steps), "last (step)"], lines)


def plot_curves(rows: list[Row], path: Path) -> None:
    """Held-out token accuracy against step, one line per run (dashed: paused) in its `run_colours` colour, one panel
    per task cell."""
    by_cell: dict[tuple, list[Row]] = {}
    for r in rows:
        by_cell.setdefault(tuple(sorted(r["task"].items())), []).append(r)
    width, height = max(7.0, 4.6 * len(by_cell) + 1.0), 3.8 + 0.16 * max(map(len, by_cell.values()))  # legend lines
    with _figure(path, 1, len(by_cell), figsize=(width, height), sharey=True, squeeze=False) as (fig, axes):
        column, colours = EVAL_COLUMNS["token_acc"], run_colours(rows)
        for ax, (cell, at_cell) in zip(axes[0], by_cell.items(), strict=True):
            for r in at_cell:
                is_paused = r["ended"] == "paused"
                steps, accs = [e[0] for e in r["evals"]], [100 * e[column] for e in r["evals"]]
                ax.plot(steps, accs, color=colours[r["unit"], r["seed"]], ls="--" if is_paused else "-",
                        label=f"{r['unit']} seed {r['seed']}" + (" (paused)" if is_paused else ""))  # fmt: skip
            task = dict(cell)
            title = ", ".join(f"{k} {v}" for k, v in task.items() if k not in ("name", "vocab"))
            ax.set(title=f"{task['name']}: {title}", xlabel="step", ylim=(0, 101))
            ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)  # below the axes
        axes[0][0].set_ylabel("held-out token accuracy (%)")
        fig.suptitle("Held-out accuracy during training (every evaluation)", fontsize=10)


def write_doc(plan: RunPlan, folder: Path, doc: Path) -> str:
    """Rewrite the <!-- synthetic:FAMILY --> sections of `doc` (plots in doc's img/ folder); returns a summary."""
    image_dir = doc.parent / "img"
    image_dir.mkdir(exist_ok=True)
    filled = fill_sections(doc.read_text(encoding="utf-8"), sections(plan, folder, image_dir, "img/"), "synthetic")
    write_atomic(doc, filled)
    return f"{doc}: sections {', '.join(plan.families)} from {folder}"


def write_folder(plan: RunPlan, folder: Path, out: Path) -> str:
    """results.md (every section) and the plots in `out`; returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    markdown = "\n\n".join(f"## {family}\n\n{text}" for family, text in sections(plan, folder, out, "").items()) + "\n"
    write_atomic(out / "results.md", markdown)
    return markdown
