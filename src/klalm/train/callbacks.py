"""Training callbacks: per-step metrics with throughput/MFU/memory, periodic text samples, and an early stop.

`StepMetrics` writes one row per `trainer.log_every_n_steps` optimiser steps to every logger (CSV, TensorBoard,
wandb), straight through `logger.log_metrics`, so large counters such as tokens seen stay exact integers:

    train/loss, train/grad_norm, train/lr, train/skipped_steps        from LMModule.step_metrics
    train/skipped_records          bad data records skipped so far (on_bad_record=skip), all ranks; text data only
    train/tokens_seen, perf/tokens_per_s, perf/tokens_per_s_per_device, perf/step_time_ms
    perf/step_time_ms_median, perf/step_time_ms_max   the window's steps one by one, as the GPU saw them (CUDA
                                   events at each step's end; the host's clock on CPUs): a few slow steps, or all?
    perf/mfu                       only on GPUs whose peak rate is known (flops.PEAK_BF16_FLOPS) or is configured
    perf/peak_mem_gb               CUDA only: peak allocated memory since the previous row, GiB
    perf/peak_reserved_gb          CUDA only: peak memory the caching allocator held since the previous row, GiB
    perf/alloc_retries             CUDA only: times since the previous row that the allocator found no free block,
                                   released its cache and asked the driver again (slow, synchronising; a step that
                                   nearly fills the GPU shows it here before it runs out of memory)

`StopAfterSteps` ends training after a given optimiser step while the lr schedule keeps the full run's length, so a
short window of a long recipe can be compared across launch modes:
`klalm-train ... +callbacks.stop._target_=klalm.train.callbacks.StopAfterSteps +callbacks.stop.steps=50`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from klalm.models.sampling import sample_text
from klalm.train.csv_logger import ContinuingCSVLogger
from klalm.train.distributed import gather_objects
from klalm.train.flops import peak_flops, train_flops_per_token

log = logging.getLogger(__name__)


def skipped_records(trainer: pl.Trainer) -> dict[str, int] | None:
    """Bad records skipped so far by every rank's training stream, per reason; None for data modules without
    records (synthetic tokens). A collective under data parallelism: every rank must call it."""
    count = getattr(trainer.datamodule, "skipped_records", None)
    if count is None:
        return None
    totals: Counter[str] = Counter()
    for counts in gather_objects(count()):
        totals.update(counts)
    return dict(totals)


class StepMetrics(Callback):
    """Logs training metrics, throughput, MFU and peak memory every `trainer.log_every_n_steps` steps.

    Args:
        peak_flops_per_device: peak FLOP/s of one device for MFU; None looks the GPU name up in
            `flops.PEAK_BF16_FLOPS` (MFU is omitted, with one log line, on CPUs and unknown GPUs).
    """

    def __init__(self, peak_flops_per_device: float | None = None) -> None:
        self.peak_flops_per_device = peak_flops_per_device
        self.flops_per_token = 0.0
        self._window_start = 0.0
        self._window_tokens = 0
        self._window_steps = 0
        self._marks: list[Any] = []  # the window's start and each step's end: CUDA events, or perf_counter() on CPUs
        self._alloc_retries = 0  # the process's allocator retries at the window's start (CUDA; counted per process)
        self.last_row: dict[str, float] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.flops_per_token = train_flops_per_token(pl_module.model, pl_module.budget.seq_len)
        if self.peak_flops_per_device is None and pl_module.device.type == "cuda":
            name = torch.cuda.get_device_name(pl_module.device)
            self.peak_flops_per_device = peak_flops(name)
            if self.peak_flops_per_device is None:
                log.warning("MFU omitted: no peak FLOP/s known for %r (set callbacks.metrics.peak_flops_...)", name)
        elif self.peak_flops_per_device is None:
            log.info("MFU omitted on %s (peak rates are tabulated for GPUs only)", pl_module.device.type)
        log.info("training FLOPs per token: %.4g", self.flops_per_token)
        for logger in trainer.loggers:  # rows a killed run wrote past the checkpoint are logged again from here
            if isinstance(logger, ContinuingCSVLogger):
                logger.drop_rows_after(trainer.global_step)
        self._reset_window(pl_module)

    def _reset_window(self, pl_module: pl.LightningModule) -> None:
        self._window_start, self._window_tokens, self._window_steps = time.perf_counter(), 0, 0
        self._marks = [_time_mark(pl_module.device)]
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
            self._alloc_retries = _alloc_retries(pl_module.device)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        self._window_tokens += pl_module.budget.tokens_per_step
        self._window_steps += 1
        self._marks.append(_time_mark(pl_module.device))
        step = trainer.global_step
        if step % trainer.log_every_n_steps and step != trainer.max_steps:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        elapsed = max(time.perf_counter() - self._window_start, 1e-9)
        pl_module.check_skipped_steps()  # this step's skip is counted in the row (LMModule reads it a step late)
        tokens_per_s = self._window_tokens / elapsed
        row = {k: float(v) for k, v in pl_module.step_metrics.items()}
        row.update({
            "train/tokens_seen": pl_module.tokens_seen,
            "perf/tokens_per_s": tokens_per_s,
            "perf/tokens_per_s_per_device": tokens_per_s / trainer.world_size,
            "perf/step_time_ms": 1e3 * elapsed / self._window_steps,
        })  # fmt: skip
        steps_ms = sorted(_elapsed_ms(a, b) for a, b in zip(self._marks, self._marks[1:]))
        row["perf/step_time_ms_median"] = steps_ms[(len(steps_ms) - 1) // 2]
        row["perf/step_time_ms_max"] = steps_ms[-1]
        skipped = skipped_records(trainer)
        if skipped is not None:
            row["train/skipped_records"] = sum(skipped.values())
        if self.peak_flops_per_device:
            row["perf/mfu"] = self.flops_per_token * tokens_per_s / (self.peak_flops_per_device * trainer.world_size)
        if pl_module.device.type == "cuda":
            row["perf/peak_mem_gb"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
            row["perf/peak_reserved_gb"] = torch.cuda.max_memory_reserved(pl_module.device) / 2**30
            row["perf/alloc_retries"] = _alloc_retries(pl_module.device) - self._alloc_retries
        self.last_row = row
        for logger in trainer.loggers:
            logger.log_metrics(row, step=step)
        self._reset_window(pl_module)


def _alloc_retries(device: torch.device) -> int:
    """The CUDA caching allocator's retries so far in this process (cudaMalloc failed, cache freed, tried again)."""
    return torch.cuda.memory_stats(device).get("num_alloc_retries", 0)


def _time_mark(device: torch.device) -> Any:
    """A point in time as the device sees it: a recorded CUDA event (no wait), or the host clock elsewhere."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _elapsed_ms(start: Any, end: Any) -> float:
    """Milliseconds between two `_time_mark`s (CUDA events must have completed: the caller synchronised)."""
    return start.elapsed_time(end) if isinstance(start, torch.cuda.Event) else 1e3 * (end - start)


class TextSampler(Callback):
    """Writes a text sample from a fixed prompt every `every_n_steps` steps and at the end of training.

    Samples are appended to `<path>` as "step N: <text>" blocks (every rank generates, since sharded models need all
    ranks for a forward pass; rank 0 writes). Runs without a tokenizer (synthetic data) cannot sample: the
    callback then raises at the start of training rather than silently doing nothing.

    Args:
        path: output text file (`<run_dir>/samples.txt`).
        prompt: text the samples continue.
        every_n_steps: period in optimiser steps; 0 samples only at the end.
        max_new_tokens: tokens generated per sample.
        temperature: softmax temperature; 0 decodes greedily.
        top_k: sample among the k most likely tokens (0 = all).
        seed: seed of the sampling generator (the training RNGs are not touched).
    """

    def __init__(
        self,
        path: str | Path,
        prompt: str = "The",
        every_n_steps: int = 0,
        max_new_tokens: int = 64,
        temperature: float = 0.8,
        top_k: int = 50,
        seed: int = 0,
    ) -> None:
        self.path, self.prompt, self.every_n_steps = Path(path), prompt, every_n_steps
        self.max_new_tokens, self.temperature, self.top_k, self.seed = max_new_tokens, temperature, top_k, seed
        self.last_sample: str | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if getattr(trainer.datamodule, "tokenizer", None) is None:
            raise ValueError("callbacks.sampler needs a tokenizer, but the data module has none; remove the sampler")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0 and step != trainer.max_steps:
            self.write(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.write(trainer, pl_module)

    def write(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> str:
        """Generates one sample with the current weights and appends it to the samples file (rank 0)."""
        text = sample_text(
            pl_module.model,
            trainer.datamodule.tokenizer,
            self.prompt,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            seed=self.seed,
        )
        self.last_sample = text
        if trainer.is_global_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(f"=== step {trainer.global_step} ===\n{text}\n\n")
            log.info("sample at step %d: %r", trainer.global_step, text[:200])
        return text


class StepProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar counting optimiser steps out of `max_steps`, labelled "train", with the loss and tokens/s.

    Lightning counts fetched batches, which are micro-batches here (`LMModule` pulls `accumulate` of them per step),
    so its own bar overshoots its total and loses it on resume; and it is labelled "Epoch 0", which means nothing in a
    run measured in tokens. The loss and tokens/s shown are `StepMetrics`' latest row (the one the loggers get, every
    `trainer.log_every_n_steps` steps), so drawing the bar never waits for the GPU.
    Args as `TQDMProgressBar`.
    """

    @property
    def train_description(self) -> str:
        return "train"

    def init_train_tqdm(self) -> Tqdm:
        """Lightning's train bar, created with its step count and the step the run starts at: created without, it
        drew "train: 0/?" before the first step."""
        return Tqdm(
            desc=self.train_description, position=2 * self.process_position, disable=self.is_disabled, leave=True,
            dynamic_ncols=True, file=sys.stdout, smoothing=0, bar_format=self.BAR_FORMAT,
            total=self.trainer.max_steps, initial=self.trainer.global_step,
        )  # fmt: skip

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._count_steps(trainer)  # a resumed run restarts mid-epoch, without on_train_epoch_start

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        if self._leave:  # Lightning's own override would relabel the bar "Epoch <n>"
            self.train_progress_bar = self.init_train_tqdm()
        self._count_steps(trainer)

    def _count_steps(self, trainer: pl.Trainer) -> None:
        """Counts from the step the run starts at (a resumed run's too): no "0/N" drawn first, and the rate and the
        time left measured over this start's steps only (tqdm's `reset` would draw 0 and time from it)."""
        bar = self.train_progress_bar
        bar.total, bar.n = trainer.max_steps, trainer.global_step
        bar.initial = bar.last_print_n = trainer.global_step
        bar.start_t = bar.last_print_t = time.time()
        bar.refresh()

    def init_validation_tqdm(self) -> Tqdm:
        """Lightning's validation bar, drawn only on a terminal: written to a log file or a pipe, a second bar is
        cursor-movement codes ("[A") between the lines."""
        if sys.stdout.isatty():
            return super().init_validation_tqdm()
        return Tqdm(disable=True)

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """The bar's postfix: the latest loss, Lightning's (val/loss, val/ppl) without the logger version, tokens/s."""
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        measured = [c.last_row for c in trainer.callbacks if isinstance(c, StepMetrics)]
        if measured and "train/loss" in measured[0]:
            metrics = {"loss": f"{measured[0]['train/loss']:.3f}", **metrics}
        if measured and "perf/tokens_per_s" in measured[0]:
            metrics["tok/s"] = f"{measured[0]['perf/tokens_per_s']:,.0f}"
        return metrics

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        step = trainer.global_step
        if self.train_progress_bar is not None and self._should_update(step, self.train_progress_bar.total):
            self.train_progress_bar.n = step
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
            self.train_progress_bar.refresh()


class StopAfterSteps(Callback):
    """Stops training after optimiser step `steps` (the schedule still spans the configured token budget).

    Args:
        steps: optimiser steps to run (≥ 1); a resumed run counts from step 0 of the original run.
    """

    def __init__(self, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"callbacks.stop.steps={steps} must be ≥ 1")
        self.steps = steps

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True
