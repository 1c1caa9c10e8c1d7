"""docs/RESULTS.md from the study's results folder: tables and a plot, regenerated, around hand-written prose.

The document keeps its prose; what lies between ``<!-- study:NAME -->`` and ``<!-- /study:NAME -->`` is replaced by
the section NAME below, built only from the committed run.json / val.csv / eval.json files that `klalm-study`
wrote (and the composed experiment config), so no number in them is typed by hand. Sections: setup, recipe,
main (one row per model), sweep, differences (against gpt_45m), noise (seeds), cost (the paper's token budgets at
the measured rates); and the plot of the validation curves.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from klalm.fileio import save_figure, write_atomic
from klalm.markdown import fill_sections, percent
from klalm.study import results
from klalm.study.files import read_json
from klalm.study.spec import Spec

PLOT = "img/study_val_loss.png"  # relative to the document
TASK_METRICS = (("hellaswag", "acc"), ("hellaswag", "acc_norm"), ("piqa", "acc"), ("piqa", "acc_norm"))
BASELINE = "gpt_45m"


def _runs(spec: Spec) -> list[dict[str, Any]]:
    """run.json of every finished run with its zero-shot results attached under "eval"."""
    rows = []
    for record in results.finished(spec, sweep=False):
        folder = results.cell_dir(spec, record)
        rows.append({**record, "eval": read_json(folder / "eval.json")})
    return rows


def _scores(run: dict[str, Any], task: str) -> dict[str, float]:
    return next(iter(run["eval"]["results"].values()))[task]


def _pct(run: dict[str, Any], task: str, metric: str) -> str:
    scores = _scores(run, task)
    return percent(scores[metric], scores[metric + "_stderr"])  # stderr None: lm-eval could not compute it


def section_setup(spec: Spec, runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "No run has finished yet."
    first = runs[0]
    versions = ", ".join(f"{k} {v}" for k, v in first["versions"].items())
    dates = sorted(r["date"][:10] for r in runs)
    data = first["data"]
    lines = [
        f"- GPU: {first['gpu']}; training with DDP on {' or '.join(str(g) for g in sorted({r['gpus'] for r in runs}))}"
        " GPUs of one host (each run's count is in the table below); one GPU for evaluation.",
        f"- Software: {versions}; klalm commit {', '.join(sorted({r['commit'] for r in runs}))}.",
        f"- Dates: {dates[0]} to {dates[-1]}.",
        f"- Data: {data['train_tokens']:,} train tokens staged ({'PARTIAL' if data['partial'] else 'all'} of the "
        f"pack; shard files {', '.join(data['shards'])}); each run trains {first['tokens']:,} tokens "
        f"({first['steps']} steps).",
        f"- Recipe: `klalm-train {' '.join(o for o in first['overrides'] if o.startswith('experiment'))}` with, "
        "per model, the overrides in the table below (every override of every run is in its run.json).",
    ]
    return "\n".join(lines)


def section_recipe(spec: Spec, runs: list[dict[str, Any]]) -> str:
    """Every hyperparameter of the composed experiment that a run depends on, and each model's own settings."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("klalm.configs", version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={spec.experiment}", *spec.overrides])
    keys = [
        "data.seq_len", "data.batch_size", "data.seed", "data.shuffle", "train.global_batch_tokens",
        "train.max_tokens", "train.grad_clip", "train.compile", "train.val_every_n_steps", "optim._target_",
        "optim.betas", "optim.eps", "optim.weight_decay", "scheduler._target_", "scheduler.warmup",
        "scheduler.min_lr_ratio", "trainer.precision", "data.val_batches",
    ]  # fmt: skip
    lines = ["| setting | value |", "| --- | --- |"]
    lines += [f"| `{key}` | `{OmegaConf.select(cfg, key)}` |" for key in keys]
    lines += ["", "| model | peak lr | lr from | dynamics lr × | seeds |", "| --- | ---: | --- | ---: | --- |"]
    for model, options in spec.models.items():
        lr = results.best_lr(spec, spec.lr_source(model))
        seeds = [*spec.seeds, *spec.extra_seeds.get(model, [])]
        source = "its own sweep" if options["lr"] == "sweep" else f"the sweep of {options['lr']}"
        lines.append(f"| {model} | {'—' if lr is None else f'{lr:g}'} | {source} | {options['dynamics_lr_scale']:g} | "
                     f"{', '.join(map(str, seeds))} |")  # fmt: skip
    return "\n".join(lines)


def section_noise(spec: Spec, runs: list[dict[str, Any]]) -> str:
    """The seed-to-seed spread of each model run with several seeds, next to the spread between models."""
    lines = []
    for model in spec.models:
        seeds = sorted((r for r in runs if r["model"] == model), key=lambda r: r["seed"])
        if len(seeds) > 1:
            losses = ", ".join(f"{r['val']['loss']:.4f} (seed {r['seed']})" for r in seeds)
            spread = max(r["val"]["loss"] for r in seeds) - min(r["val"]["loss"] for r in seeds)
            lines.append(f"- {model}: whole-shard val loss {losses}: a spread of {spread:.4f} between seeds.")
    first = [r for r in runs if r["seed"] == spec.seeds[0]]
    if first:
        ranked = sorted(first, key=lambda r: r["val"]["loss"])
        order = " < ".join(f"{r['model']} {r['val']['loss']:.4f}" for r in ranked)
        lines.append(
            f"- First seeds, best to worst: {order} (range {ranked[-1]['val']['loss'] - ranked[0]['val']['loss']:.4f})."
        )
    return "\n".join(lines) or "No model has run with two seeds yet."


def section_main(spec: Spec, runs: list[dict[str, Any]]) -> str:
    head = ["model", "seed", "params", "tokens", "peak lr", "dyn. lr ×", "skipped steps", "GPUs", "tokens/s", "GPU-min"]
    head += ["val loss", "val ppl"]
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
            f"{run['dynamics_lr_scale']:g}", str(run["skipped_steps"]), str(run["gpus"]),
            f"{run['throughput']['tokens_per_s']:,.0f}",
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
    recovered = [r for r in sweep if "recovered" in r]
    if recovered:
        names = ", ".join(r["cell"] for r in recovered)
        lines += ["", f"Recovered cells ({names}): {recovered[0]['recovered']}."]
    partial = {r["data"]["partial"] for r in sweep}
    if True in partial:
        tokens = sorted({r["data"]["train_tokens"] for r in sweep})
        lines += ["", f"The sweep ran while only part of the train split was staged ({tokens[0]:,} tokens): its "
                  "windows are a shuffled subset of that part."]  # fmt: skip
    return "\n".join(lines)


def _difference(run: dict[str, Any], base: dict[str, Any], task: str, metric: str) -> str:
    a, b = _scores(run, task), _scores(base, task)
    delta, errors = a[metric] - b[metric], (a[metric + "_stderr"], b[metric + "_stderr"])
    noise = None if None in errors else math.hypot(*errors)  # n/a when either stderr is
    flag = " (> 2σ)" if noise is not None and abs(delta) > 2 * noise else ""
    return percent(delta, noise, signed=True) + flag


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


def _arch(model: str) -> str:
    return model.rsplit("_", 1)[0]


def section_cost(spec: Spec, runs: list[dict[str, Any]]) -> str:
    """GPU-hours for the paper's token budgets: each model's one-GPU rate from this study's sweep where it was swept,
    else from the committed bench_lm rows of `cost.bench_rows` (a model in neither gets dashes)."""
    chosen = {m: results.best_lr(spec, m) for m in spec.sweep["lrs"]}
    sweep = {r["model"]: r for r in results.finished(spec, sweep=True) if r["lr"] == chosen[r["model"]]}
    bench = results.bench_rates(spec.cost["bench_rows"])
    first = {r["model"]: r for r in reversed(runs)}
    budgets = [(t, g) for t in spec.cost["tokens"] for g in spec.cost["gpus"]]
    head = ["model", "1-GPU tokens/s", "multi-GPU efficiency"]
    head += [f"{t / 1e9:g}B tokens, {g} GPU{'s' if g > 1 else ''}" for t, g in budgets]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    rates: dict[str, tuple[float, str] | None] = {}
    for model in [*spec.models, *spec.cost["models_180m"]]:
        single = sweep.get(model)
        rates[model] = (single["throughput"]["tokens_per_s_per_gpu"], "sweep") if single else bench.get(model)
    efficiency: dict[str, float] = {}
    for model in spec.models:
        if first.get(model) is not None and rates[model] is not None:
            efficiency[_arch(model)] = first[model]["throughput"]["tokens_per_s_per_gpu"] / rates[model][0]
    above_one = sorted(arch for arch, eff in efficiency.items() if eff > 1)
    for model, rate in rates.items():
        eff = efficiency.get(_arch(model))
        if rate is None:
            cells = [model, "not measured", "—"] + ["—"] * len(budgets)
        else:
            one, source = rate
            scaling = float("nan") if eff is None else min(eff, 1.0)  # see the note on efficiencies above 100 %
            hours = [t / (one * (1 if g == 1 else g * scaling)) / 3600 for t, g in budgets]
            shown = "—" if eff is None else f"{eff:.0%}" + ("*" if eff > 1 else "")
            cells = [model, f"{one:,.0f} ({'sweep' if source == 'sweep' else 'bench_lm'})", shown]
            cells += [f"{h:,.1f}" for h in hours]
        lines.append("| " + " | ".join(cells) + " |")
    gpus = sorted({r["gpus"] for r in runs})
    files = sorted({source for rate in rates.values() if rate and (source := rate[1]) != "sweep"})
    lines += [
        "",
        "Hours of wall-clock time on H200s. 1-GPU tokens/s: this study's sweep (one GPU, the study's recipe) where "
        "the model was swept, else `scripts/bench_lm.py` at the study's shape (B16 × T2048, bf16, no compile, random "
        f'tokens) from {", ".join(f"`{f}`" for f in files) or "no file"}; "not measured": in neither. '
        f"Multi-GPU efficiency: per-GPU tokens/s of this study's {'/'.join(map(str, gpus))}-GPU DDP run over the "
        "1-GPU rate, measured at 45M and applied unchanged to 180M and to 8 GPUs (neither measured here).",
    ]
    if above_one:
        lines[-1] += (
            f" \\* Above 100 % ({', '.join(above_one)}): the DDP run's per-GPU rate beats a 1-GPU rate measured in "
            "another session on other code (bench_lm), so the two do not compare; its multi-GPU hours assume perfect "
            "scaling (100 %)."
        )
    return "\n".join(lines)


def plot_val_curves(spec: Spec, runs: list[dict[str, Any]], out_png: Path) -> Path:
    """Validation loss against training tokens for every run (curve subset) and the whole-shard final loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    try:
        for run in runs:
            with open(results.cell_dir(spec, run) / "val.csv", newline="", encoding="utf-8") as handle:
                rows = list(csv.DictReader(handle))
            tokens = [int(r["tokens"]) / 1e6 for r in rows]
            label = f"{run['model']} (seed {run['seed']})"
            (line,) = ax.plot(tokens, [float(r["val/loss"]) for r in rows], label=label)
            ax.plot([run["tokens"] / 1e6], [run["val"]["loss"]], "o", color=line.get_color())
        ax.set_xlabel("training tokens (millions)")
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_title("45M models on Wikipedia: validation loss (dots: whole validation shard)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        out_png.parent.mkdir(parents=True, exist_ok=True)
        save_figure(fig, out_png, dpi=120)
    finally:
        plt.close(fig)
    return out_png


SECTIONS: dict[str, Callable[[Spec, list[dict[str, Any]]], str]] = {
    "setup": section_setup,
    "recipe": section_recipe,
    "main": section_main,
    "sweep": section_sweep,
    "differences": section_differences,
    "noise": section_noise,
    "cost": section_cost,
}


def write_report(spec: Spec, doc: Path) -> str:
    """Regenerates the sections of `doc` (which must exist with its markers) and the plot; returns a summary."""
    runs = _runs(spec)
    sections = {name: build(spec, runs) for name, build in SECTIONS.items()}
    text = fill_sections(doc.read_text(encoding="utf-8"), sections, "study")
    write_atomic(doc, text)
    if runs:
        plot_val_curves(spec, runs, doc.parent / PLOT)
    return f"{doc}: {len(runs)} runs, {len(results.finished(spec, sweep=True))} sweep cells"
