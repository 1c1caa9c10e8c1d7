"""Tables (Markdown) and plots (PNG) of a synthetic-benchmark run, from its results.json content.

- A5: the minimum number of blocks at which any seed reaches the threshold, per length and arch
  (">D" = not solved up to the deepest tried depth D); in brackets the best held-out accuracy of that cell.
- MQAR: best held-out accuracy (over learning rates and seeds) per (length, pairs) cell and arch.
- MAD: best held-out accuracy per task and arch, and the mean over tasks.

Every table has a `steps` column (the optimiser steps each arch's runs took, min-max) and marks with † a value that
rests on a run the time budget stopped before its planned steps, so a short run is never read as a full one.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

Runs = list[dict[str, Any]]


def _archs(runs: Runs) -> list[str]:
    return list(dict.fromkeys(r["arch"] for r in runs))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


CUT_SHORT = "†"


def cut_short(run: dict[str, Any]) -> bool:
    """The time budget ended the run before its planned steps."""
    return run["steps"] < run.get("planned_steps", run["steps"])


def _mark(text: str, runs: Runs) -> str:
    """`text`, marked with CUT_SHORT when any of `runs` (the runs behind it) was cut short."""
    return f"{text} {CUT_SHORT}" if any(cut_short(r) for r in runs) else text


def _steps(runs: Runs) -> str:
    steps = sorted(r["steps"] for r in runs)
    return str(steps[0]) if steps[0] == steps[-1] else f"{steps[0]}-{steps[-1]}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def a5_min_blocks(runs: Runs, a5_plan: dict) -> dict[str, dict[int, tuple[int | None, float]]]:
    """arch -> length -> (minimum solving depth or None, best metric value seen in that cell)."""
    metric = {"token": "token_acc", "sequence": "seq_acc"}[a5_plan["criterion"]]
    cells: dict[str, dict[int, tuple[int | None, float]]] = defaultdict(dict)
    for arch in _archs(runs):
        mine = [r for r in runs if r["arch"] == arch]
        for length in sorted({r["length"] for r in mine}):
            cell = [r for r in mine if r["length"] == length]
            solved = [r["n_layers"] for r in cell if r[metric] >= a5_plan["threshold"]]
            cells[arch][length] = (min(solved) if solved else None, max(r[metric] for r in cell))
    return cells


def best_by(runs: Runs, key: str) -> dict[str, dict[Any, float]]:
    """arch -> runs[key] value -> best token accuracy over the other settings (lr, wd, seed)."""
    best: dict[str, dict[Any, float]] = defaultdict(dict)
    for r in runs:
        cell = r[key] if not isinstance(r[key], list) else tuple(r[key])
        best[r["arch"]][cell] = max(best[r["arch"]].get(cell, 0.0), r["token_acc"])
    return best


def a5_section(runs: Runs, a5_plan: dict, out_dir: Path) -> str:
    cells = a5_min_blocks(runs, a5_plan)
    deepest = max(a5_plan["depths"])
    lengths = sorted({r["length"] for r in runs})
    rows = []
    for arch, per_length in cells.items():
        row = [arch]
        for n in lengths:
            cell = per_length.get(n)
            behind = [r for r in runs if r["arch"] == arch and r["length"] == n]
            row.append("-" if cell is None else _mark(f"{cell[0] or f'>{deepest}'} ({_pct(cell[1])})", behind))
        rows.append(row + [_steps([r for r in runs if r["arch"] == arch])])
    short = {(r["arch"], r["length"]) for r in runs if cut_short(r)}
    _plot_a5(cells, lengths, deepest, a5_plan, short, out_dir / "a5_min_blocks.png")
    header = ["arch"] + [f"L={n}" for n in lengths] + ["steps"]
    criterion = f"{a5_plan['criterion']} accuracy >= {100 * a5_plan['threshold']:.0f}%"
    return f"### A5: minimum blocks ({criterion}; best accuracy % in brackets)\n\n" + _table(header, rows)


def _plot_a5(cells: dict, lengths: list[int], deepest: int, a5_plan: dict, short: set, path: Path) -> None:
    """Minimum blocks per arch: grouped bars at each length (so one length reads as well as many), a hatched bar up
    to the "not solved" line where no tried depth reached the threshold, the best accuracy written on each bar
    (with † where a run behind it was cut short by the time budget)."""
    archs = list(cells)
    width = 0.8 / max(len(archs), 1)
    crowded = len(archs) * len(lengths) > 12  # then the accuracies stand upright above their bars
    fig, ax = plt.subplots(figsize=(min(12.0, max(6.0, 1.5 + len(lengths) * (0.3 + 0.25 * len(archs)))), 4.5))
    for i, arch in enumerate(archs):
        for j, length in enumerate(lengths):
            if length not in cells[arch]:
                continue
            depth, best = cells[arch][length]
            x = j + (i - (len(archs) - 1) / 2) * width
            solved = depth is not None
            ax.bar(x, depth if solved else deepest + 1, width, color=f"C{i}", hatch=None if solved else "//",
                   alpha=1.0 if solved else 0.35, label=arch if j == 0 else None)  # fmt: skip
            label = f"{100 * best:.0f}%" + (f" {CUT_SHORT}" if (arch, length) in short else "")
            top = (depth if solved else deepest + 1) + 0.05
            ax.annotate(label, (x, top), ha="center", va="bottom", fontsize=7, rotation=90 if crowded else 0)
    ax.axhline(deepest + 0.5, color="grey", lw=0.8, ls=":")
    ax.set_xticks(range(len(lengths)), [f"L={n}" for n in lengths])
    ax.set_yticks(range(1, deepest + 2), [*map(str, range(1, deepest + 1)), f"not solved\n(<= {deepest})"])
    ax.set_ylim(0, deepest + (2.0 if crowded else 1.6))
    ax.set(xlabel="sequence length", ylabel="minimum blocks")
    ax.set_title(f"A5: min blocks reaching {100 * a5_plan['threshold']:.0f}% ({a5_plan['criterion']} acc)", fontsize=10)
    ax.legend(fontsize=8, ncols=len(archs), loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def mqar_section(runs: Runs, out_dir: Path) -> str:
    best = best_by([{**r, "cell": (r["length"], r["pairs"])} for r in runs], "cell")
    cells = sorted({(r["length"], r["pairs"]) for r in runs})
    rows = []
    for arch, per in best.items():
        mine = [r for r in runs if r["arch"] == arch]
        behind = {c: [r for r in mine if (r["length"], r["pairs"]) == c] for c in cells}
        rows.append([arch] + [_mark(_pct(per.get(c)), behind[c]) for c in cells] + [_steps(mine)])
    fig, ax = plt.subplots(figsize=(6, 4))
    for arch, per in best.items():
        xs = [c for c in cells if c in per]
        ax.plot([c[0] for c in xs], [100 * per[c] for c in xs], marker="o", label=arch)
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel="sequence length (pairs grow with it)",
        ylabel="accuracy (%)",
        ylim=(0, 101),
        title="MQAR: held-out accuracy at query positions",
    )
    ax.set_xticks([c[0] for c in cells], [f"{n}\nK={k}" for n, k in cells])
    ax.minorticks_off()
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "mqar_accuracy.png", dpi=120)
    plt.close(fig)
    header = ["arch"] + [f"L={n} K={k}" for n, k in cells] + ["steps"]
    return "### MQAR: accuracy % (best learning rate)\n\n" + _table(header, rows)


def mad_section(runs: Runs, out_dir: Path) -> str:
    best = best_by(runs, "task")
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    rows = []
    for arch, per in best.items():
        mine = [r for r in runs if r["arch"] == arch]
        values = [per.get(t) for t in tasks]
        mean = sum(values) / len(values) if None not in values else None
        marked = [_mark(_pct(v), [r for r in mine if r["task"] == t]) for v, t in zip(values, tasks)]
        rows.append([arch] + marked + [_mark(_pct(mean), mine), _steps(mine)])
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(best), 1)
    for i, (arch, per) in enumerate(best.items()):
        ax.bar([t + i * width for t in range(len(tasks))], [100 * per.get(t, 0.0) for t in tasks], width, label=arch)
    ax.set_xticks(
        [t + 0.4 - width / 2 for t in range(len(tasks))], [t.removeprefix("mad_") for t in tasks], rotation=20
    )
    ax.set(ylabel="accuracy (%)", ylim=(0, 101), title="MAD-Lab: held-out accuracy (best lr/wd)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "mad_accuracy.png", dpi=120)
    plt.close(fig)
    header = ["arch"] + [t.removeprefix("mad_") for t in tasks] + ["mean", "steps"]
    return "### MAD-Lab: accuracy % (best lr x wd)\n\n" + _table(header, rows)


def problems_section(runs: Runs) -> str:
    """Failed and skipped runs, one line each."""
    lines = [
        f"- {r['family']} {r['arch']} "
        + " ".join(f"{k}={r[k]}" for k in ("length", "pairs", "task", "n_layers") if k in r)
        + f": {r.get('error') or r.get('skipped')}"
        for r in runs
    ]
    return "### Failed or skipped runs\n\n" + "\n".join(lines)


def write_report(results: dict, out_dir: Path) -> str:
    """Write results.md and the PNGs into out_dir; returns the Markdown."""
    problems = [r for r in results["runs"] if "error" in r or "skipped" in r]
    runs = [r for r in results["runs"] if r not in problems]
    wall = f", {results['wall_s']:.0f} s" if "wall_s" in results else ""
    parts = [f"## Synthetic benchmarks ({results['device_name']}, {len(runs)} runs{wall})"]
    families = {
        "a5": lambda rs: a5_section(rs, results["plan"]["a5"], out_dir),
        "mqar": lambda rs: mqar_section(rs, out_dir),
        "mad": lambda rs: mad_section(rs, out_dir),
    }
    for family, section in families.items():
        mine = [r for r in runs if r["family"] == family]
        if mine:
            parts.append(section(mine))
    if problems:
        parts.append(problems_section(problems))
    short = [r for r in runs if cut_short(r)]
    if short:
        parts.append(
            f"{CUT_SHORT} rests on a run that the time budget stopped before its planned steps ({len(short)} of "
            f"{len(runs)} runs; `steps` gives each arch's steps, min-max): compare such values with care."
        )
    markdown = "\n\n".join(parts) + "\n"
    (out_dir / "results.md").write_text(markdown)
    return markdown
