"""Whole-LM training throughput: tokens/s, MFU and peak memory of short runs on synthetic random tokens.

One command measures every experiment model in turn (in one process, so imports and CUDA start once) and prints a
Markdown table; a model that fails (an error, out of memory) gets its error in its row and the others still run.

    # the ten 45m/180m models on one GPU (bf16, B16 × T2048, no accumulation), ~15 steps each:
    python scripts/bench_lm.py
    # a subset, other shapes, extra Hydra overrides:
    python scripts/bench_lm.py --models kla_45m,gpt_45m --steps 20 --override train.compile=true
    # CPU check with the tiny presets:
    python scripts/bench_lm.py --models kla_tiny,gpt_tiny --trainer cpu --seq-len 64 --batch-size 2 --steps 4 \
        --log-every 2

The numbers come from the last logging window (steps after the first window, which holds compilation and autotuning):
tokens/s over wall-clock time including data and optimiser, MFU from klalm.train.flops, and the peak allocated
CUDA memory in that window.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from hydra import compose, initialize_config_module

from klalm.train.app import run

ALL_MODELS = [f"{a}_{s}" for s in ("45m", "180m") for a in ("gpt", "kla", "mamba", "gdn", "gpt_kla")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ALL_MODELS), help="comma-separated configs/model names")
    parser.add_argument("--steps", type=int, default=15, help="optimiser steps per model")
    parser.add_argument("--log-every", type=int, default=5, help="steps per measurement window (≤ steps/2)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step (B)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (T)")
    parser.add_argument("--vocab-size", type=int, default=50257, help="random-token vocabulary (GPT-2's)")
    parser.add_argument("--trainer", default="gpu", help="configs/trainer file (gpu: bf16 on one GPU)")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.steps < 2 * args.log_every:
        parser.error(f"--steps {args.steps} must be at least 2 × --log-every {args.log_every}")
    return args


def overrides_for(model: str, args: argparse.Namespace, run_dir: Path) -> list[str]:
    tokens_per_step = args.batch_size * args.seq_len
    return [
        "experiment=bench",
        f"model={model}",
        f"trainer={args.trainer}",
        f"data.seq_len={args.seq_len}",
        f"data.batch_size={args.batch_size}",
        f"data.vocab_size={args.vocab_size}",
        f"train.global_batch_tokens={tokens_per_step}",
        f"train.max_tokens={args.steps * tokens_per_step}",
        f"trainer.log_every_n_steps={args.log_every}",
        f"paths.run_dir={run_dir}",
        *args.override,
    ]


def bench_one(model: str, args: argparse.Namespace, root: Path) -> dict:
    """Runs one model; returns its row (with "error" set when it failed)."""
    started = time.time()
    try:
        cfg = compose("train", overrides=overrides_for(model, args, root / model))
        summary = run(cfg)
        return {"model": model, **summary, "wall_s": time.time() - started}
    except Exception as err:  # one failing model must not stop the table: report it in its row
        logging.getLogger("bench_lm").error("%s failed:\n%s", model, traceback.format_exc())
        message = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:160]
        return {"model": model, "error": message.replace("|", "/"), "wall_s": time.time() - started}
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def table(rows: list[dict], args: argparse.Namespace) -> str:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    head = (
        f"Whole-LM training throughput, {device}, {time.strftime('%Y-%m-%d')}, trainer={args.trainer}, "
        f"B{args.batch_size} × T{args.seq_len}, vocab {args.vocab_size}, synthetic tokens, "
        f"last {args.log_every} of {args.steps} steps\n\n"
    )
    lines = [
        "| model | params | tokens/s | MFU | step ms | peak mem GB | loss | wall s | status |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {_fmt(row.get('params'), ',')} | {_fmt(row.get('perf/tokens_per_s'), ',.0f')} | "
            f"{_fmt(row.get('perf/mfu'), '.1%')} | {_fmt(row.get('perf/step_time_ms'), '.1f')} | "
            f"{_fmt(row.get('perf/peak_mem_gb'), '.2f')} | {_fmt(row.get('train/loss'), '.3f')} | "
            f"{row['wall_s']:.0f} | {row.get('error', 'ok')} |"
        )
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="klalm-bench-") as tmp,
        initialize_config_module("klalm.configs", version_base="1.3"),
    ):
        for model in models:
            rows.append(bench_one(model, args, Path(tmp)))
            print(f"[bench_lm] {model}: {rows[-1].get('error', 'ok')}", file=sys.stderr, flush=True)
    text = table(rows, args)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 1 if all("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
