"""Where a training step's time goes: one or more optimiser steps under torch.profiler, broken down by kind of work.

`ProfileSteps` (a Lightning callback) profiles optimiser steps [start_step, start_step + steps) and writes into
its directory:

    profile.md     a Markdown table: time per step by category (scan, attention, matmul, optimizer, data, other),
                   the sum over categories, and the wall-clock time of a step; then the 20 largest kernels; on a
                   GPU also how long it sat idle and what the host ran in its longest idle stretches
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


IDLE_GAPS = 10  # rows of the table of the GPU's longest idle stretches
MIN_GAP_US = 10.0  # shorter stretches between kernels are launch latency, not waiting


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as sorted, disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(event: Any, start: float, end: float) -> float:
    return max(0.0, min(event.time_range.end, end) - max(event.time_range.start, start))


def _host_work(cpu_events: list, start: float, end: float, n: int = 3) -> str:
    """What the host ran in [start, end): the operators and annotated ranges with the most self time in it (their
    time there less their children's), e.g. `Optimizer.step#AdamW.step` for Python time inside the optimiser."""
    selfs: dict[str, float] = {}
    for event in cpu_events:
        own = _overlap(event, start, end) - sum(_overlap(child, start, end) for child in event.cpu_children)
        if own > 0:
            selfs[event.name] = selfs.get(event.name, 0.0) + own
    traced = sum(selfs.values())
    parts = [f"`{name[:60]}` {us / 1e3:.2f}" for name, us in sorted(selfs.items(), key=lambda kv: -kv[1])[:n]]
    untraced = max(0.0, (end - start) - traced)  # host time in no profiled operator (Python between them)
    return ", ".join(parts + ([f"untraced {untraced / 1e3:.2f}"] if untraced >= MIN_GAP_US else []))


def gpu_idle_table(events: list, steps: int, n: int = IDLE_GAPS) -> str:
    """Where the GPU waits: the profiled window (first to last event, host or device) less the union of the
    device's kernels and copies, per step, then the `n` longest idle stretches (≥ MIN_GAP_US) with what the host
    ran during each, in ms. Empty without device events. The profiler adds host time to every operator, so the
    idle time here is an upper bound of the unprofiled step's."""
    device = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    if not device:
        return ""
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    first = min(e.time_range.start for e in events)
    last = max(e.time_range.end for e in events)
    busy = _merged([(e.time_range.start, e.time_range.end) for e in device])
    edges = [first] + [t for interval in busy for t in interval] + [last]
    gaps = [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2) if edges[i + 1] - edges[i] >= MIN_GAP_US]
    busy_ms = sum(end - start for start, end in busy) / 1e3 / steps
    window_ms = (last - first) / 1e3 / steps
    lines = [
        f"GPU busy {busy_ms:.2f} ms a step (the union of its kernels and copies), idle {window_ms - busy_ms:.2f} ms "
        f"of the {window_ms:.2f} ms profiled window",
        "",
        f"| idle stretch ({min(n, len(gaps))} longest) | ms | from ms | host work in it (self ms) |",
        "| --- | ---: | ---: | --- |",
    ]
    for rank, (start, end) in enumerate(sorted(gaps, key=lambda g: g[0] - g[1])[:n], 1):
        where = _host_work(cpu, start, end).replace("|", "\\|")
        lines.append(f"| {rank} | {(end - start) / 1e3:.2f} | {(start - first) / 1e3:.2f} | {where} |")
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
        if on_gpu:
            self.table += "\n" + gpu_idle_table(events, self.steps)
        if trainer.is_global_zero:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "profile.md").write_text(self.table)
            (self.out_dir / "kernels.md").write_text(top_kernels_table(events, on_gpu, self.steps, n=None))
            self._profiler.export_chrome_trace(str(self.out_dir / "trace.json"))
