"""Whole-LM training throughput: tokens/s, MFU and peak memory of short runs on synthetic random tokens.

One command measures every experiment model in turn (in one process, so imports and CUDA start once) and prints a
Markdown table; a model that fails (an error, out of memory) gets its error in its row and the others still run.

    # the ten 45m/180m models on one GPU (bf16, B16 × T2048, no accumulation), ~15 steps each:
    python scripts/bench_lm.py
    # a subset, other shapes, extra Hydra overrides:
    python scripts/bench_lm.py --models kla_45m,gpt_45m --steps 20 --override train.compile=true
    # context lengths at a fixed 32,768 tokens per step (B = 32768 / T), with and without torch.compile; ends with
    # one table of tokens/s per (T, compile) and each model's ratio to the gpt of its size:
    python scripts/bench_lm.py --models gpt_45m,kla_45m,mamba_45m,gpt_kla_45m --seq-lens 2048,8192,16384,32768 \
        --tokens-per-step 32768 --compile both
    # the same sweep split over several commands (each writes its rows beside --out as .json), then one table:
    python scripts/bench_lm.py --models gpt_45m,kla_45m --seq-lens 2048,8192 --tokens-per-step 32768 --out a.md
    python scripts/bench_lm.py --models gpt_45m,kla_45m --seq-lens 16384,32768 --tokens-per-step 32768 --out b.md
    python scripts/bench_lm.py --merge a.json b.json
    # ... and as a plot: tokens/s against T, and each model's ratio to the gpt of its size
    python scripts/bench_lm.py --merge a.json b.json --plot lm_sweep.png
    # an A/B that states its noise: every model three times, in turn (A B A B A B), each row the median run with the
    # spread of the three:
    python scripts/bench_lm.py --models kla_45m,gpt_45m --compile on --steps 60 --log-every 20 --repeats 3
    # where one training step's time goes (scan, attention, matmul, optimizer, data, other; torch.profiler):
    python scripts/bench_lm.py --models kla_45m,gpt_45m --profile
    # CPU check with the tiny presets:
    python scripts/bench_lm.py --models kla_tiny,gpt_tiny --trainer cpu --seq-len 64 --batch-size 2 --steps 4 \
        --log-every 2

The numbers come from the last logging window (steps after the first window, which holds compilation and autotuning):
tokens/s over wall-clock time including data and optimiser, MFU from klalm.train.flops, and the peak allocated
CUDA memory in that window. `--profile` profiles the second-to-last step (klalm.train.profiling.ProfileSteps); with
`--out`, every profiled run's table of all its kernels goes beside it (`<out>_<model>_B.._T.._<compiled>_kernels.md`).
`--out` is rewritten after every (T, compile) setting, so a command stopped by a time limit keeps the settings it
finished (on the device, where a call ends at 600 s, also run each slow-compiling model in its own command); each file
(tables, rows, kernels, `--plot`) is replaced whole, so a kill mid-write leaves the previous one. SIGTERM
(`timeout`, a scheduler) stops the command at once, even inside a compile that takes minutes (Lightning alone would
wait for the step to end, and torch's compiler may catch the exception or wrap it in its own: SIGTERM is sent again
every 2 s): the setting in progress keeps the rows of the models that ran, the stopped model's row says "Stopped",
and the exit code is 143.
Every row records how it ran (`ran_with`: the optimiser as configured, the extra overrides and the klalm commit); a
table ends with a line naming them, or, where its rows differ in them (a merged table), a line for each way.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import NamedTuple

import torch
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

from klalm.fileio import image_name_problem, save_figure, write_atomic
from klalm.provenance import git_commit
from klalm.train.app import run

ALL_MODELS = [f"{a}_{s}" for s in ("45m", "180m") for a in ("gpt", "kla", "mamba", "gdn", "gpt_kla")]
COMPILE_MODES = {"off": (False,), "on": (True,), "blocks": ("blocks",), "both": (False, True)}  # -> train.compile
COMPILE_NAMES = {False: "off", True: "on", "blocks": "blocks"}  # a setting's compile in the sweep table
STOPPED_EXIT_CODE = 143  # 128 + SIGTERM


RESTOP_S = 2.0  # while a run goes on after SIGTERM, SIGTERM is sent to it again this often


class Stopped(Exception):
    """SIGTERM arrived during a run: raised wherever the main thread is, so a model stops inside its compile too."""


# "by": what stopped this command, once SIGTERM came; "armed": a model's run is in progress, where SIGTERM raises
# Stopped (elsewhere, between runs or while a row is written, it is noted and the bench stops before the next run)
_stop: dict = {}


def _on_sigterm(signum: int, frame: object) -> None:
    # Lightning's own handler, installed for each fit, calls this one after its own (it keeps the handler it finds).
    _stop.setdefault("by", f"stopped by {signal.Signals(signum).name}")
    if _stop.get("armed"):
        raise Stopped(_stop["by"])


def _stop_again(done: threading.Event) -> None:
    """torch's compiler may catch Stopped (it logs it and goes on) or wrap it in its own exception: while a run goes on
    after SIGTERM, SIGTERM is sent to the main thread again every RESTOP_S seconds (a thread of main()'s)."""
    while not done.wait(RESTOP_S):
        if "by" in _stop and _stop.get("armed"):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)


class Setting(NamedTuple):
    """One benchmarked shape: sequences per step, tokens per sequence, and train.compile (false, true or "blocks")."""

    batch_size: int
    seq_len: int
    compile: bool | str


def run_label(setting: Setting) -> str:
    """How a setting's compile reads in run folders and file names."""
    return {False: "eager", True: "compiled", "blocks": "compiled-blocks"}[setting.compile]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ALL_MODELS), help="comma-separated configs/model names")
    parser.add_argument("--steps", type=int, default=15, help="optimiser steps per model")
    parser.add_argument("--log-every", type=int, default=5, help="steps per measurement window (≤ steps/2)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step (B)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (T)")
    parser.add_argument("--seq-lens", default=None, help="comma-separated T values to sweep (overrides --seq-len)")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="fix B·T: B = this // T (overrides B)")
    parser.add_argument("--compile", choices=sorted(COMPILE_MODES), default="off",
                        help="train.compile false (off), true (on), blocks, or off then on (both)")  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="profile one step per run (torch.profiler)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each model, taken in turn; a row is the "
                        "median run and gives the spread of tokens/s over the runs")  # fmt: skip
    parser.add_argument("--vocab-size", type=int, default=50257, help="random-token vocabulary (GPT-2's)")
    parser.add_argument("--trainer", default="gpu", help="configs/trainer file (gpu: bf16 on one GPU)")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here and the rows beside it")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, help="print the sweep table of saved rows")
    parser.add_argument("--plot", type=Path, default=None, help="also plot the sweep (tokens/s and ratios by T) here")
    args = parser.parse_args(argv)
    try:
        lengths = seq_lens(args)
    except ValueError:
        parser.error(f"--seq-lens {args.seq_lens!r} must be whole numbers separated by commas, e.g. 2048,8192")
    models = model_names(args)
    for name, values in (("--seq-lens", lengths), ("--models", models)):
        if twice := sorted({str(v) for v in values if values.count(v) > 1}):
            parser.error(f"{name} names {', '.join(twice)} more than once (each run would take the same folder)")
    for path in [*(args.merge or []), *(p.parent for p in (args.plot, args.out) if p is not None)]:
        if not path.exists():
            parser.error(f"no such {'file' if path in (args.merge or []) else 'folder'}: {path}")
    if args.plot is not None and (why := image_name_problem(args.plot)) is not None:  # not once the sweep has run
        parser.error(f"--plot {args.plot}: {why}")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats} must be at least 1")
    if args.steps < 2 * args.log_every:
        parser.error(f"--steps {args.steps} must be at least 2 × --log-every {args.log_every}")
    for seq_len in lengths:
        if args.tokens_per_step is not None and args.tokens_per_step < seq_len:
            parser.error(f"--tokens-per-step {args.tokens_per_step} is less than one sequence of T = {seq_len}")
    return args


def model_names(args: argparse.Namespace) -> list[str]:
    return [m.strip() for m in args.models.split(",") if m.strip()]


def seq_lens(args: argparse.Namespace) -> list[int]:
    return [int(t) for t in args.seq_lens.split(",")] if args.seq_lens else [args.seq_len]


def settings(args: argparse.Namespace) -> list[Setting]:
    """Every (B, T, compile) the command asked for, T outermost."""
    return [
        Setting(args.tokens_per_step // t if args.tokens_per_step else args.batch_size, t, compiled)
        for t in seq_lens(args)
        for compiled in COMPILE_MODES[args.compile]
    ]


def overrides_for(model: str, args: argparse.Namespace, setting: Setting, run_dir: Path) -> list[str]:
    tokens_per_step = setting.batch_size * setting.seq_len
    profile = [
        "+callbacks.profile._target_=klalm.train.profiling.ProfileSteps",
        f"+callbacks.profile.out_dir={run_dir}",
        f"+callbacks.profile.start_step={args.steps - 2}",
    ]
    return [
        "experiment=bench",
        f"model={model}",
        f"trainer={args.trainer}",
        f"data.seq_len={setting.seq_len}",
        f"data.batch_size={setting.batch_size}",
        f"data.vocab_size={args.vocab_size}",
        f"train.global_batch_tokens={tokens_per_step}",
        f"train.max_tokens={args.steps * tokens_per_step}",
        f"train.compile={str(setting.compile).lower()}",
        f"trainer.log_every_n_steps={args.log_every}",
        f"paths.run_dir={run_dir}",
        *(profile if args.profile else []),
        *args.override,
    ]


def optimizer_name(optim: DictConfig) -> str:
    """The optimiser a config builds, e.g. "AdamW (fused)"; AdamW's `fused: null` is torch's default, foreach."""
    name = str(optim.get("_target_", "?")).rpartition(".")[2]
    return f"{name} ({'fused' if optim.get('fused') else 'foreach'})" if "fused" in optim else name


def bench_one(model: str, args: argparse.Namespace, setting: Setting, root: Path, repeat: int = 0) -> dict:
    """Runs one model (its `repeat`-th run of this setting); returns its row (with "error" set when it failed,
    "status" when it finished although SIGTERM came during it, "profile" with --profile, and "ran_with" always)."""
    started = time.time()
    compiled = run_label(setting)
    run_dir = root / f"{model}-B{setting.batch_size}-T{setting.seq_len}-{compiled}-run{repeat}"
    ran_with = {"optimizer": None, "overrides": list(args.override), "commit": git_commit()}
    # Each run compiles afresh, as a training run of one shape does: dynamo would otherwise take the model of the next
    # T for a recompile and mark the sizes that changed dynamic (automatic dynamic shapes), so every row after a
    # process's first T ran a dynamic-shape graph.
    torch.compiler.reset()
    try:
        cfg = compose("train", overrides=overrides_for(model, args, setting, run_dir))
        ran_with["optimizer"] = optimizer_name(cfg.optim)
        summary = _run_armed(cfg)
        row = {"model": model, "setting": setting, **summary, "wall_s": time.time() - started, "ran_with": ran_with}
        if "by" in _stop:  # torch's compiler swallowed the stop and the run went on to its end: measured, but say so
            row["status"] = f"ok, finished after {_stop['by']} (its compile may have skipped autotuning)"
        if args.profile:
            row["profile"] = (run_dir / "profile.md").read_text()
            row["kernels"] = (run_dir / "kernels.md").read_text()
        return row
    except (Exception, SystemExit) as err:  # one failing model must not stop the table: report it in its row
        if isinstance(err, SystemExit) and "by" not in _stop:
            raise
        logging.getLogger("bench_lm").error("%s failed:\n%s", model, traceback.format_exc())
        message = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:160]
        if "by" in _stop:  # whatever torch wrapped it in (BackendCompilerFailed, InductorError; Lightning's exit 143)
            message = f"Stopped: {_stop['by']}"
        return {"model": model, "setting": setting, "error": message.replace("|", "/"), "wall_s": time.time() - started,
                "ran_with": ran_with}  # fmt: skip
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _run_armed(cfg: DictConfig) -> dict:
    """`run(cfg)` with SIGTERM raising Stopped inside it (a SIGTERM that came before it stops it at once)."""
    _stop["armed"] = True
    try:
        if "by" in _stop:
            raise Stopped(_stop["by"])
        return run(cfg)
    finally:
        _stop["armed"] = False


def bench_setting(models: list[str], args: argparse.Namespace, setting: Setting, root: Path) -> tuple[list[dict], str]:
    """Each model's row for one setting (the median of its --repeats runs, the models in turn so that drift over time
    hits each alike), and "" or, when SIGTERM stopped a run, its message (then the rows of the models that ran)."""
    runs: dict[str, list[dict]] = {model: [] for model in models}
    for repeat, model in ((repeat, model) for repeat in range(args.repeats) for model in models):
        if "by" in _stop:  # SIGTERM stopped a run, or came between runs: no run starts after it
            break
        row = bench_one(model, args, setting, root, repeat)
        runs[model].append(row)
        print(f"[bench_lm] {model} {setting} run {repeat + 1}: {status(row)}", file=sys.stderr, flush=True)
    return [median_row(r) for r in runs.values() if r], f"Stopped: {_stop['by']}" if "by" in _stop else ""


def status(row: dict) -> str:
    """A row's status column: its error, or "ok" (with what came during the run, if anything)."""
    return row.get("error") or row.get("status", "ok")


def median_row(runs: list[dict]) -> dict:
    """One row for repeated runs of a model: the run with the median tokens/s (the lower middle one of an even
    count) of those measured, with their tokens/s and spread, (max - min) / median, and its status saying how many
    ran when a stop (SIGTERM) cut the last one short; a failed run's row if any failed otherwise, or if none was
    measured."""
    measured = [r for r in runs if "error" not in r]
    failed = [r for r in runs if "error" in r and not r["error"].startswith("Stopped:")]
    if failed or not measured:
        return (failed or runs)[0]
    ordered = sorted(measured, key=lambda r: r["perf/tokens_per_s"])
    row = dict(ordered[(len(ordered) - 1) // 2])
    speeds = [r["perf/tokens_per_s"] for r in measured]
    row["runs/tokens_per_s"] = speeds
    row["runs/spread"] = (max(speeds) - min(speeds)) / row["perf/tokens_per_s"]
    notes = [r["status"] for r in measured if "status" in r]  # a run that finished after SIGTERM, whichever it was
    if len(measured) < len(runs):
        notes.append(f"{len(measured)} measured runs, then stopped")
    if notes:
        row["status"] = "ok, " + "; ".join(note.removeprefix("ok, ") for note in notes)
    else:
        row.pop("status", None)
    return row


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def describe_ran_with(ran_with: dict | None) -> str:
    """How a row ran, e.g. `AdamW (fused), overrides: x=1 y=2, commit abc1234` ("not recorded" for older rows)."""
    if not ran_with:
        return "optimiser, overrides and commit not recorded"
    optimizer, overrides = ran_with.get("optimizer") or "optimiser unknown", " ".join(ran_with.get("overrides") or [])
    return f"{optimizer}, overrides: {overrides or 'none'}, commit {ran_with.get('commit')}"


def ran_with_note(rows: list[dict]) -> str:
    """One line when every row ran alike; otherwise a line per way of running, naming its rows (model@T)."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(describe_ran_with(row.get("ran_with")), []).append(f"{row['model']}@{row['setting'].seq_len}")
    if len(groups) == 1:
        return f"All rows ran with {next(iter(groups))}.\n"
    lines = [f"- {how}: {', '.join(which)}" for how, which in groups.items()]
    return "**The rows did not all run alike:**\n\n" + "\n".join(lines) + "\n"


def table(rows: list[dict], args: argparse.Namespace, setting: Setting) -> str:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    head = (
        f"Whole-LM training throughput, {device}, {time.strftime('%Y-%m-%d')}, trainer={args.trainer}, "
        f"B{setting.batch_size} × T{setting.seq_len}, train.compile={str(setting.compile).lower()}, "
        f"vocab {args.vocab_size}, synthetic tokens, last {args.log_every} of {args.steps} steps"
        + (f"; each row the median of {args.repeats} runs taken in turn" if args.repeats > 1 else "")
        + "\n\n"
    )
    ran = ran_with_note(rows)
    runs = ["tokens/s of each run", "spread"] if args.repeats > 1 else []
    header = ["model", "params", "tokens/s", *runs, "MFU", "step ms", "step ms median / max", "peak mem GB",
              "reserved GB / alloc retries", "loss",
              "wall s", "status"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 2) + " --- |"]
    for row in rows:
        each = ", ".join(f"{v:,.0f}" for v in row.get("runs/tokens_per_s", []))
        spread = [each or "—", _fmt(row.get("runs/spread"), ".1%")] if runs else []
        cells = [row["model"], _fmt(row.get("params"), ","), _fmt(row.get("perf/tokens_per_s"), ",.0f"), *spread,
                 _fmt(row.get("perf/mfu"), ".1%"), _fmt(row.get("perf/step_time_ms"), ".1f"),
                 " / ".join(_fmt(row.get(f"perf/step_time_ms_{k}"), ".1f") for k in ("median", "max")),
                 _fmt(row.get("perf/peak_mem_gb"), ".2f"),
                 f"{_fmt(row.get('perf/peak_reserved_gb'), '.2f')} / {_fmt(row.get('perf/alloc_retries'), '.0f')}",
                 _fmt(row.get("train/loss"), ".3f"), f"{row['wall_s']:.0f}",
                 status(row)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n\n" + ran


def gpt_of(model: str) -> str | None:
    """The attention baseline of a model's size ("kla_45m" -> "gpt_45m"); None for a gpt model itself."""
    arch, _, size = model.rpartition("_")
    return None if arch == "gpt" else f"gpt_{size}"


def sweep_table(rows: list[dict], models: list[str]) -> str:
    """Tokens/s by (T, compile) × model, with each model's ratio to the gpt of its size when both ran, and for each
    such model the smallest T at which it overtakes that gpt (per compile setting). Rows by compile setting (in run
    order), then T."""
    speed = {(r["setting"], r["model"]): r.get("perf/tokens_per_s") for r in rows}
    ratios = [m for m in models if gpt_of(m) in models]
    compiles = list(dict.fromkeys(r["setting"].compile for r in rows))  # in run order
    ordered = sorted(dict.fromkeys(r["setting"] for r in rows), key=lambda s: (compiles.index(s.compile), s.seq_len))
    header = ["T", "B", "compile"] + [c for m in models for c in ([m, f"{m} / {gpt_of(m)}"] if m in ratios else [m])]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for setting in ordered:
        cells = [str(setting.seq_len), str(setting.batch_size), COMPILE_NAMES[setting.compile]]
        for m in models:
            cells.append(_fmt(speed.get((setting, m)), ",.0f"))
            if m in ratios:
                ours, base = speed.get((setting, m)), speed.get((setting, gpt_of(m)))
                cells.append(_fmt(ours / base if ours and base else None, ".2f"))
        lines.append("| " + " | ".join(cells) + " |")
    notes = []
    for m in ratios:
        for compiled in compiles:
            over = [s.seq_len for s in ordered if s.compile == compiled
                    and (speed.get((s, m)) or 0) >= (speed.get((s, gpt_of(m))) or math.inf)]  # fmt: skip
            where = f"T = {over[0]}" if over else "no measured T"
            notes.append(f"- {m} overtakes {gpt_of(m)} (compile {COMPILE_NAMES[compiled]}): {where}")
    table_text = "Tokens/s by context length\n\n" + "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"
    return table_text + "\n" + ran_with_note(rows)


def plot_sweep(rows: list[dict], models: list[str], path: Path) -> Path:
    """Tokens/s against T (left) and each model's ratio to the gpt of its size (right), one line per (model,
    compile); runs that failed are left out.

    Raises:
        ValueError: no row has a tokens/s value.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speed = {(r["setting"], r["model"]): r["perf/tokens_per_s"] for r in rows if r.get("perf/tokens_per_s")}
    if not speed:
        raise ValueError("no row has a tokens/s value to plot")
    fig, (ax_speed, ax_ratio) = plt.subplots(1, 2, figsize=(11, 4))
    try:
        colors = {model: f"C{i % 10}" for i, model in enumerate(models)}  # one colour per model in both panels
        for compiled in dict.fromkeys(s.compile for s, _ in speed):
            style = {False: "--s", True: "-o", "blocks": ":^"}[compiled]
            for model in models:
                points = sorted((s.seq_len, v) for (s, m), v in speed.items() if m == model and s.compile == compiled)
                if not points:
                    continue
                label = f"{model}, compile {COMPILE_NAMES[compiled]}"
                ax_speed.plot(*zip(*points), style, color=colors[model], label=label)
                ratios = sorted((s.seq_len, v / speed[s, gpt_of(m)]) for (s, m), v in speed.items()
                                if m == model and s.compile == compiled and (s, gpt_of(m)) in speed)  # fmt: skip
                if ratios:
                    ax_ratio.plot(*zip(*ratios), style, color=colors[model], label=f"{label} / {gpt_of(model)}")
        ax_ratio.axhline(1.0, color="grey", linewidth=1, linestyle=":")
        lengths = sorted({s.seq_len for s, _ in speed})
        for ax, ylabel in ((ax_speed, "tokens/s"), (ax_ratio, "tokens/s relative to the gpt of its size")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(t) for t in lengths])
            ax.minorticks_off()
            ax.set_xlabel("context length T (tokens per sequence; B·T fixed per run)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)
    return path


def setting_texts(setting_rows: list[dict], args: argparse.Namespace, setting: Setting) -> list[str]:
    """The table of one setting, then each run's profile (with --profile)."""
    shape = f"B{setting.batch_size} × T{setting.seq_len}, train.compile={str(setting.compile).lower()}"
    profiles = [f"Profile of one training step: {r['model']}, {shape}\n\n{r['profile']}" for r in setting_rows
                if "profile" in r]  # fmt: skip
    return [table(setting_rows, args, setting), *profiles]


def save_rows(rows: list[dict], path: Path) -> None:
    """The rows as JSON (settings as dicts, profiles left out), for `--merge`."""
    plain = [{**{k: v for k, v in r.items() if k not in ("profile", "kernels")}, "setting": r["setting"]._asdict()}
             for r in rows]  # fmt: skip
    write_atomic(path, json.dumps(plain, indent=1) + "\n")


def kernels_path(out: Path, row: dict) -> Path:
    """Where `--out` puts a profiled run's table of every kernel: beside it, named by model and setting."""
    setting = row["setting"]
    compiled = run_label(setting)
    return out.with_name(f"{out.stem}_{row['model']}_B{setting.batch_size}_T{setting.seq_len}_{compiled}_kernels.md")


def load_rows(paths: list[Path]) -> list[dict]:
    """The rows saved by earlier runs (`save_rows`), in order.

    Raises:
        ValueError: a file is not such rows (e.g. the .md table instead of the .json beside it), naming it.
    """
    rows = []
    for path in paths:
        try:
            rows += [{**r, "setting": Setting(**r["setting"])} for r in json.loads(path.read_text())]
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise ValueError(f"{path} holds no rows of bench_lm.py --out (its .json file): {err}") from None
    return rows


def one_row_each(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """One row per (setting, model) of rows merged from several runs: the last measured one, or where none was
    measured the last failed one (a run stopped in one call and repeated in the next leaves both); and the
    `model@T` of those measured more than once, whose earlier rows are dropped."""
    kept: dict[tuple, dict] = {}  # in the order each (setting, model) first appears, as the table reads them
    again: dict[str, None] = {}
    for row in rows:
        key = (row["setting"], row["model"])
        if key in kept and kept[key].get("perf/tokens_per_s"):
            if not row.get("perf/tokens_per_s"):
                continue  # a failed row never hides a measured one
            again[f"{row['model']}@{row['setting'].seq_len}"] = None
        kept[key] = row
    return list(kept.values()), list(again)


def merge(paths: list[Path]) -> tuple[str, list[dict]]:
    """The sweep table of rows saved by earlier runs (models in their first-seen order; `one_row_each`), and the
    rows it shows."""
    rows, again = one_row_each(load_rows(paths))
    text = sweep_table(rows, list(dict.fromkeys(r["model"] for r in rows)))
    if again:
        text += f"\nMeasured more than once, the last file's row kept: {', '.join(again)}.\n"
    return text, rows


def write_out(out: Path, texts: list[str], rows: list[dict]) -> None:
    """The tables so far into `out`, their rows beside it as .json (for `--merge`) and any profiled run's kernels."""
    write_atomic(out, "\n".join(texts))
    save_rows(rows, out.with_suffix(".json"))
    for row in rows:  # --profile: every kernel of each profiled run, beside the tables
        if "kernels" in row:
            write_atomic(kernels_path(out, row), row["kernels"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        try:
            text, rows = merge(args.merge)
        except ValueError as err:
            sys.exit(f"bench_lm: {err}")
        print(text)
        if args.plot is not None:
            print(f"[bench_lm] wrote {plot_sweep(rows, list(dict.fromkeys(r['model'] for r in rows)), args.plot)}")
        return 0
    models = model_names(args)
    rows, texts = [], []
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    done = threading.Event()
    again = threading.Thread(target=_stop_again, args=(done,), daemon=True)
    again.start()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="klalm-bench-") as tmp,
            initialize_config_module("klalm.configs", version_base="1.3"),
        ):
            for setting in settings(args):
                setting_rows, stopped = bench_setting(models, args, setting, Path(tmp))
                new = setting_texts(setting_rows, args, setting)
                print(*new, sep="\n", flush=True)
                texts += new
                rows += setting_rows
                if args.out is not None:  # after every setting: a command stopped in a later one keeps these
                    write_out(args.out, texts, rows)
                if stopped:
                    print(f"[bench_lm] {stopped}: the rows above are all this command measured", file=sys.stderr)
                    return STOPPED_EXIT_CODE
    finally:
        done.set()
        again.join()  # before SIGTERM's handler is given back: no SIGTERM of its own reaches that one
        signal.signal(signal.SIGTERM, previous)
        _stop.clear()
    if len(settings(args)) > 1:
        texts.append(sweep_table(rows, models))
        print(texts[-1])
    if args.plot is not None and any(r.get("perf/tokens_per_s") for r in rows):
        print(f"[bench_lm] wrote {plot_sweep(rows, models, args.plot)}")
    if args.out is not None:
        write_out(args.out, texts, rows)
    return 1 if all("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
