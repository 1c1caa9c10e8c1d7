"""Where a training step's time goes: one or more optimiser steps under torch.profiler, broken down by kind of work.

`ProfileSteps` (a Lightning callback) profiles optimiser steps [start_step, start_step + steps) and writes into
its directory:

    profile.md     a Markdown table: time per step by category (scan, attention, matmul, optimizer, data, other),
                   the sum over categories, and the wall-clock time of a step; then the 20 largest kernels
    kernels.md     every kernel of those steps by time, with its calls per step (where many small ones add up)
    trace.json     the Chrome trace of those steps (open in https://ui.perfetto.dev or chrome://tracing)

On a GPU the categories split the device's kernels and copies by name; on a CPU they split the self time of the
profiled operators (coarser, but it lets the callback run in tests without a GPU). `scripts/bench_lm.py --profile`
installs it for each benchmarked model:

    python scripts/bench_lm.py --models kla_45m,gpt_45m --profile
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# Category by kernel (GPU) or operator (CPU) name; the first match wins, anything else is OTHER.
CATEGORIES: tuple[tuple[str, re.Pattern], ...] = (
    ("scan", re.compile(r"_kla_|_ss_|kla_scan|selective_scan")),  # klalm's Triton scans (custom ops on CPU)
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|cublas|xmma|nvjet|triton_tem|^aten::(mm|addmm|bmm|matmul|linear)$", re.I)),
    ("optimizer", re.compile(r"multi_tensor_apply|adam|_foreach", re.I)),  # AdamW and the gradient-norm clip
    ("data", re.compile(r"memcpy htod|dataloader", re.I)),  # host-to-device copies (GPU), the loader (CPU)
)
OTHER = "elementwise & other"  # norms, activations, softmax/cross-entropy, inductor's fused kernels, copies


def categorize(name: str) -> str:
    """The category of a kernel or operator name (see CATEGORIES)."""
    return next((category for category, pattern in CATEGORIES if pattern.search(name)), OTHER)


def _timed(events: list, on_gpu: bool):
    """(name, µs) of each profiler event that counts: device kernels and copies on a GPU, operators' self time on a
    CPU. On a GPU the device-side spans of annotated ranges (e.g. `Optimizer.step#AdamW.step`, which covers the
    optimiser's kernels) are left out: they would count those kernels' time twice."""
    for event in events:
        if on_gpu and event.device_type == DeviceType.CUDA and not event.is_user_annotation:
            yield event.name, event.time_range.elapsed_us()
        elif not on_gpu and event.device_type == DeviceType.CPU:
            yield event.name, event.self_cpu_time_total


def breakdown(events: list, on_gpu: bool) -> dict[str, tuple[float, int]]:
    """{category: (total µs, count)} over profiler events: device kernels and copies on a GPU, operators' self time
    on a CPU."""
    totals: dict[str, tuple[float, int]] = {}
    for name, us in _timed(events, on_gpu):
        category = categorize(name)
        total, count = totals.get(category, (0.0, 0))
        totals[category] = (total + us, count + 1)
    return totals


TOP_KERNELS = 20  # rows of the table of the largest kernels


def top_kernels_table(events: list, on_gpu: bool, steps: int, n: int | None = TOP_KERNELS) -> str:
    """Markdown table of the `n` kernels (operators on a CPU; None: all of them) with the most time, per step: what
    each category is made of (e.g. which fused elementwise kernels cost most)."""
    totals: dict[str, tuple[float, int]] = {}
    for name, us in _timed(events, on_gpu):
        total, count = totals.get(name, (0.0, 0))
        totals[name] = (total + us, count + 1)
    what = "kernel" if on_gpu else "operator"
    which = f"{n} largest by time" if n is not None else f"all {len(totals)} by time"
    header = f"| {what} ({which}) | category | ms per step | calls per step |"
    lines = [header, "| --- | --- | ---: | ---: |"]
    for name, (us, count) in sorted(totals.items(), key=lambda item: -item[1][0])[:n]:
        shown = name if len(name) <= 100 else name[:97] + "..."
        shown = shown.replace("|", "\\|")
        lines.append(f"| `{shown}` | {categorize(name)} | {us / 1e3 / steps:.2f} | {count / steps:.0f} |")
    return "\n".join(lines) + "\n"


def breakdown_table(totals: dict[str, tuple[float, int]], steps: int, wall_ms: float, on_gpu: bool) -> str:
    """Markdown table of a breakdown, per step: ms, share of the summed time, and calls."""
    busy_ms = sum(us for us, _ in totals.values()) / 1e3 / steps
    what = "kernel" if on_gpu else "operator self"
    lines = [f"| category | ms per step | share of {what} time | calls per step |", "| --- | ---: | ---: | ---: |"]
    for category in [c for c, _ in CATEGORIES] + [OTHER]:
        us, count = totals.get(category, (0.0, 0))
        ms = us / 1e3 / steps
        lines.append(f"| {category} | {ms:.2f} | {ms / max(busy_ms, 1e-9):.1%} | {count / steps:.0f} |")
    lines.append(f"| sum ({what} time) | {busy_ms:.2f} | 100.0% | |")
    lines.append(f"| wall clock | {wall_ms / steps:.2f} | | |")
    return "\n".join(lines) + "\n"


class ProfileSteps(Callback):
    """Profiles `steps` optimiser steps from `start_step` on (after warm-up and compilation) and writes `profile.md`,
    `kernels.md` and `trace.json` into `out_dir`.

    Args:
        out_dir: where the two files go (e.g. the run directory).
        start_step: optimiser steps to run before profiling (compilation, autotuning and allocator warm-up).
        steps: optimiser steps to profile.
    """

    def __init__(self, out_dir: str | Path, start_step: int = 5, steps: int = 1) -> None:
        if start_step < 0 or steps < 1:
            raise ValueError(f"ProfileSteps needs start_step >= 0 and steps >= 1, got {start_step}, {steps}")
        self.out_dir, self.start_step, self.steps = Path(out_dir), start_step, steps
        self._profiler: profile | None = None
        self._started = 0.0
        self.table: str | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        if trainer.global_step != self.start_step or self._profiler is not None:
            return
        on_gpu = pl_module.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        if on_gpu:
            torch.cuda.synchronize(pl_module.device)
        self._profiler = profile(activities=activities)
        self._profiler.__enter__()
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        if self._profiler is None or self.table is not None or trainer.global_step < self.start_step + self.steps:
            return
        on_gpu = pl_module.device.type == "cuda"
        if on_gpu:
            torch.cuda.synchronize(pl_module.device)
        wall_ms = 1e3 * (time.perf_counter() - self._started)
        self._profiler.__exit__(None, None, None)
        events = self._profiler.events()
        self.table = breakdown_table(breakdown(events, on_gpu), self.steps, wall_ms, on_gpu)
        self.table += "\n" + top_kernels_table(events, on_gpu, self.steps)
        if trainer.is_global_zero:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "profile.md").write_text(self.table)
            (self.out_dir / "kernels.md").write_text(top_kernels_table(events, on_gpu, self.steps, n=None))
            self._profiler.export_chrome_trace(str(self.out_dir / "trace.json"))
