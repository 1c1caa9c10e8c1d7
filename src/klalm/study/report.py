"""docs/RESULTS.md from the study's results folder: tables and a plot, regenerated, around hand-written prose.

The document keeps its prose; what lies between ``<!-- study:NAME -->`` and ``<!-- /study:NAME -->`` is replaced by
the section NAME below, built only from the committed run.json / val.csv / eval.json files that `klalm-study`
wrote, so no number in those sections is typed by hand. Sections: setup, main (one row per model), sweep,
differences (against gpt_45m, with the noise), cost (the paper's token budgets at the measured rates), plot.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from klalm.study import results
from klalm.study.spec import Spec

PLOT = "img/study_val_loss.png"  # relative to the document
TASK_METRICS = (("hellaswag", "acc"), ("hellaswag", "acc_norm"), ("piqa", "acc"), ("piqa", "acc_norm"))
BASELINE = "gpt_45m"
COST_TOKENS = (1_000_000_000, 10_000_000_000)
COST_GPUS = (1, 8)


def _runs(spec: Spec) -> list[dict[str, Any]]:
    """run.json of every finished run with its zero-shot results attached under "eval"."""
    rows = []
    for record in results.finished(spec, sweep=False):
        folder = results.cell_dir(spec, record)
        rows.append({**record, "eval": json.loads((folder / "eval.json").read_text())})
    return rows


def _scores(run: dict[str, Any], task: str) -> dict[str, float]:
    return next(iter(run["eval"]["results"].values()))[task]


def _pct(run: dict[str, Any], task: str, metric: str) -> str:
    scores = _scores(run, task)
    return f"{100 * scores[metric]:.2f} ± {100 * scores[metric + '_stderr']:.2f}"


def section_setup(spec: Spec, runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "No run has finished yet."
    first = runs[0]
    versions = ", ".join(f"{k} {v}" for k, v in first["versions"].items())
    dates = sorted(r["date"][:10] for r in runs)
    data = first["data"]
    lines = [
        f"- GPU: {first['gpu']} × {first['gpus']} (DDP) for training; one GPU for evaluation.",
        f"- Software: {versions}; klalm commit {', '.join(sorted({r['commit'] for r in runs}))}.",
        f"- Dates: {dates[0]} to {dates[-1]}.",
        f"- Data: {data['train_tokens']:,} train tokens staged ({'PARTIAL' if data['partial'] else 'all'} of the "
        f"pack; shard files {', '.join(data['shards'])}); each run trains {first['tokens']:,} tokens "
        f"({first['steps']} steps).",
        f"- Recipe: `klalm-train {' '.join(o for o in first['overrides'] if o.startswith('experiment'))}` with, "
        "per model, the overrides in the table below (every override of every run is in its run.json).",
    ]
    return "\n".join(lines)


def section_main(spec: Spec, runs: list[dict[str, Any]]) -> str:
    head = ["model", "seed", "params", "tokens", "peak lr", "dyn. lr ×", "tokens/s", "GPU-min", "val loss", "val ppl"]
    head += [f"{t} {m}" for t, m in TASK_METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * 4 + " ---: |" * (len(head) - 4)]
    by_cell = {r["cell"]: r for r in runs}
    for cell in spec.run_cells():
        run = by_cell.get(cell.name)
        if run is None:
            lines.append(f"| {cell.model} | {cell.seed} | not run yet |" + " |" * (len(head) - 3))
            continue
        cells = [
            run["model"], str(run["seed"]), f"{run['params']:,}", f"{run['tokens']:,}", f"{run['lr']:g}",
            f"{run['dynamics_lr_scale']:g}", f"{run['throughput']['tokens_per_s']:,.0f}",
            f"{run['gpu_minutes']['total']:.1f}", f"{run['val']['loss']:.4f}", f"{run['val']['ppl']:.2f}",
        ]  # fmt: skip
        cells += [_pct(run, t, m) for t, m in TASK_METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    counts = ""
    if runs:
        scores = next(iter(runs[0]["eval"]["results"].values()))
        counts = ", ".join(f"{t} {scores[t]['n_evaluated']:,}" for t in dict(TASK_METRICS))
    lines += [
        "",
        f"val loss and ppl: the whole validation shard, every window of 2,049 tokens once ({runs[0]['val']['tokens']:,}"
        f" scored tokens). Zero-shot accuracies in %, ± lm-eval's standard error; examples: {counts}. tokens/s: the "
        "median over the logging windows after the first, all GPUs together. GPU-min: training wall time × GPUs "
        "plus the one-GPU evaluation."
        if runs
        else "",
    ]
    return "\n".join(lines)


def section_sweep(spec: Spec, runs: list[dict[str, Any]]) -> str:
    sweep = results.finished(spec, sweep=True)
    lines = [
        "| model | peak lr | steps | tokens | whole-shard val loss | chosen |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for model in spec.sweep["lrs"]:
        best = results.best_lr(spec, model)
        for row in sorted((r for r in sweep if r["model"] == model), key=lambda r: r["lr"]):
            chosen = "**chosen**" if row["lr"] == best else ""
            lines.append(
                f"| {model} | {row['lr']:g} | {row['steps']} | {row['tokens']:,} | {row['val']['loss']:.4f} | "
                f"{chosen} |"
            )
    partial = {r["data"]["partial"] for r in sweep}
    if True in partial:
        tokens = sorted({r["data"]["train_tokens"] for r in sweep})
        lines += ["", f"The sweep ran while only part of the train split was staged ({tokens[0]:,} tokens): its "
                  "windows are a shuffled subset of that part."]  # fmt: skip
    return "\n".join(lines)


def _difference(run: dict[str, Any], base: dict[str, Any], task: str, metric: str) -> str:
    a, b = _scores(run, task), _scores(base, task)
    delta = 100 * (a[metric] - b[metric])
    noise = 100 * math.hypot(a[metric + "_stderr"], b[metric + "_stderr"])
    flag = " (> 2σ)" if abs(delta) > 2 * noise else ""
    return f"{delta:+.2f} ± {noise:.2f}{flag}"


def section_differences(spec: Spec, runs: list[dict[str, Any]]) -> str:
    base = next((r for r in runs if r["model"] == BASELINE and r["seed"] == spec.seeds[0]), None)
    if base is None:
        return f"Waiting for {BASELINE}."
    head = ["model", "seed", "Δ val loss"] + [f"Δ {t} {m}" for t, m in TASK_METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * 2 + " ---: |" * (len(head) - 2)]
    for run in runs:
        if run is base:
            continue
        cells = [run["model"], str(run["seed"]), f"{run['val']['loss'] - base['val']['loss']:+.4f}"]
        cells += [_difference(run, base, t, m) for t, m in TASK_METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Against {BASELINE} (seed {spec.seeds[0]}), in points of %; ± is the two standard errors combined "
              "(√(σ₁² + σ₂²)); \"> 2σ\" marks a difference beyond twice that."]  # fmt: skip
    return "\n".join(lines)


def section_cost(spec: Spec, runs: list[dict[str, Any]]) -> str:
    sweep = {r["model"]: r for r in results.finished(spec, sweep=True)}
    lines = [
        "| model | tokens/s per GPU | source | " + " | ".join(
            f"{t // 10**9}B tokens, {g} GPU{'s' if g > 1 else ''}" for t in COST_TOKENS for g in COST_GPUS
        ) + " |",
        "| --- | ---: | --- |" + " ---: |" * (len(COST_TOKENS) * len(COST_GPUS)),
    ]  # fmt: skip
    efficiency = _ddp_efficiency(runs, sweep)
    for model in spec.models:
        run = next((r for r in runs if r["model"] == model), None)
        if run is not None:
            rate, source = run["throughput"]["tokens_per_s_per_gpu"], f"this study, {run['gpus']} GPUs"
            single = sweep[model]["throughput"]["tokens_per_s_per_gpu"] if model in sweep else rate / efficiency
        else:
            single = rate = float(spec.estimate["prior_tokens_per_s"][model])
            source = "docs/benchmarks.md (bench_lm), 1 GPU"
        hours = [t / (single if g == 1 else rate * g) / 3600 for t in COST_TOKENS for g in COST_GPUS]
        lines.append(f"| {model} | {rate:,.0f} | {source} | " + " | ".join(f"{h:.1f} h" for h in hours) + " |")
    lines += ["", f"Wall-clock hours at the measured rates. One GPU: the one-GPU rate (the sweep's, where swept). "
              f"8 GPUs: 8 × the per-GPU rate of this study's 2-GPU runs (measured 2-GPU efficiency "
              f"{efficiency:.0%}); 8-GPU scaling was not measured here."]  # fmt: skip
    return "\n".join(lines)


def _ddp_efficiency(runs: list[dict[str, Any]], sweep: dict[str, dict[str, Any]]) -> float:
    """Per-GPU tokens/s of the multi-GPU runs over the one-GPU sweep rate of the same model (mean); 1.0 if none."""
    ratios = [
        r["throughput"]["tokens_per_s_per_gpu"] / sweep[r["model"]]["throughput"]["tokens_per_s_per_gpu"]
        for r in runs
        if r["gpus"] > 1 and r["model"] in sweep
    ]
    return sum(ratios) / len(ratios) if ratios else 1.0


def plot_val_curves(spec: Spec, runs: list[dict[str, Any]], out_png: Path) -> Path:
    """Validation loss against training tokens for every run (curve subset) and the whole-shard final loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for run in runs:
        with open(results.cell_dir(spec, run) / "val.csv", newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        tokens = [int(r["tokens"]) / 1e6 for r in rows]
        (line,) = ax.plot(tokens, [float(r["val/loss"]) for r in rows], label=f"{run['model']} (seed {run['seed']})")
        ax.plot([run["tokens"] / 1e6], [run["val"]["loss"]], "o", color=line.get_color())
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("45M models on Wikipedia: validation loss (dots: whole validation shard)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


SECTIONS: dict[str, Callable[[Spec, list[dict[str, Any]]], str]] = {
    "setup": section_setup,
    "main": section_main,
    "sweep": section_sweep,
    "differences": section_differences,
    "cost": section_cost,
}


def fill(text: str, sections: dict[str, str]) -> str:
    """Replaces each ``<!-- study:NAME -->…<!-- /study:NAME -->`` block's content; fails on a missing marker."""
    for name, body in sections.items():
        pattern = re.compile(rf"(<!-- study:{name} -->\n).*?(\n<!-- /study:{name} -->)", re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"the document lacks the markers <!-- study:{name} --> … <!-- /study:{name} -->")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), text)
    return text


def write_report(spec: Spec, doc: Path) -> str:
    """Regenerates the sections of `doc` (which must exist with its markers) and the plot; returns a summary."""
    runs = _runs(spec)
    text = fill(doc.read_text(encoding="utf-8"), {name: build(spec, runs) for name, build in SECTIONS.items()})
    doc.write_text(text, encoding="utf-8")
    if runs:
        plot_val_curves(spec, runs, doc.parent / PLOT)
    return f"{doc}: {len(runs)} runs, {len(results.finished(spec, sweep=True))} sweep cells"
