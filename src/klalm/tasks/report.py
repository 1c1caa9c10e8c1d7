"""Tables (Markdown) and plots (PNG) of a synthetic-benchmark run, from its results.json content.

- A5: the minimum number of blocks at which any seed reaches the threshold, per length and arch
  (">D" = not solved up to the deepest tried depth D); in brackets the best held-out accuracy of that cell.
- MQAR: best held-out accuracy (over learning rates and seeds) per (length, pairs) cell and arch.
- MAD: best held-out accuracy per task and arch, and the mean over tasks.
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
        shown = [per_length.get(n) for n in lengths]
        rows.append([arch] + ["-" if c is None else f"{c[0] or f'>{deepest}'} ({_pct(c[1])})" for c in shown])
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (arch, per_length) in enumerate(cells.items()):
        xs = sorted(per_length)
        offset = 0.06 * (i - (len(cells) - 1) / 2)  # keeps overlapping archs visible
        ax.plot(xs, [(per_length[x][0] or deepest + 1) + offset for x in xs], marker="o", label=arch)
    ax.axhline(deepest + 0.5, color="grey", lw=0.8, ls=":")
    ax.set(
        xlabel="sequence length",
        ylabel="minimum blocks",
        title=f"A5: min blocks reaching {100 * a5_plan['threshold']:.0f}% ({a5_plan['criterion']} acc)",
    )
    ax.set_xticks(lengths)
    ax.set_yticks(range(1, deepest + 2), [*map(str, range(1, deepest + 1)), f"not solved\n(<= {deepest})"])
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "a5_min_blocks.png", dpi=120)
    plt.close(fig)
    header = ["arch"] + [f"L={n}" for n in lengths]
    criterion = f"{a5_plan['criterion']} accuracy >= {100 * a5_plan['threshold']:.0f}%"
    return f"### A5: minimum blocks ({criterion}; best accuracy % in brackets)\n\n" + _table(header, rows)


def mqar_section(runs: Runs, out_dir: Path) -> str:
    best = best_by([{**r, "cell": (r["length"], r["pairs"])} for r in runs], "cell")
    cells = sorted({(r["length"], r["pairs"]) for r in runs})
    rows = [[arch] + [_pct(per.get(c)) for c in cells] for arch, per in best.items()]
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
    header = ["arch"] + [f"L={n} K={k}" for n, k in cells]
    return "### MQAR: accuracy % (best learning rate)\n\n" + _table(header, rows)


def mad_section(runs: Runs, out_dir: Path) -> str:
    best = best_by(runs, "task")
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    rows = []
    for arch, per in best.items():
        values = [per.get(t) for t in tasks]
        mean = sum(values) / len(values) if None not in values else None
        rows.append([arch] + [_pct(v) for v in values] + [_pct(mean)])
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
    header = ["arch"] + [t.removeprefix("mad_") for t in tasks] + ["mean"]
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
    steps = sorted(r["steps"] for r in runs)
    if steps:
        parts.append(f"Training steps per run: min {steps[0]}, median {steps[len(steps) // 2]}, max {steps[-1]}.")
    markdown = "\n\n".join(parts) + "\n"
    (out_dir / "results.md").write_text(markdown)
    return markdown
