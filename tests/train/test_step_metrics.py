"""StepMetrics' CUDA memory columns, checked on the CPU with the allocator's counters patched."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from klalm.train import callbacks


def test_alloc_retries_count_since_the_previous_row_not_per_process(monkeypatch):
    """The allocator's retry counter is per process (bench_lm runs many settings in one); each row reports the
    retries of its own window, and the peak reserved memory the allocator held in it."""
    retries = {"n": 7}  # retries of earlier runs in the same process
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: {"num_alloc_retries": retries["n"]})
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 2 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 3 * 2**30)
    monkeypatch.setattr(callbacks, "_time_mark", lambda device: 0.0)
    monkeypatch.setattr(callbacks, "_elapsed_ms", lambda start, end: 1.0)
    module = SimpleNamespace(
        device=torch.device("cuda"), budget=SimpleNamespace(tokens_per_step=8), step_metrics={}, tokens_seen=0,
        check_skipped_steps=lambda: None,
    )  # fmt: skip
    trainer = SimpleNamespace(global_step=0, log_every_n_steps=2, max_steps=100, world_size=1, loggers=[],
                              datamodule=None)  # fmt: skip
    metrics = callbacks.StepMetrics(peak_flops_per_device=None)
    metrics._reset_window(module)
    rows = []
    for step, new_retries in ((1, 0), (2, 3), (3, 0), (4, 0)):  # three retries in the first window, none after
        retries["n"] += new_retries
        trainer.global_step = step
        metrics.on_train_batch_end(trainer, module)
        if step % 2 == 0:
            rows.append(metrics.last_row)
    assert [row["perf/alloc_retries"] for row in rows] == [3, 0]
    assert rows[0]["perf/peak_reserved_gb"] == 3.0 and rows[0]["perf/peak_mem_gb"] == 2.0


def test_the_progress_bar_of_a_resumed_run_starts_at_its_step():
    """A run resumed at step 20 of 200 draws 20/200 at once (not 0/200 first) and measures its rate from there."""
    import io
    from types import SimpleNamespace

    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    from klalm.train.callbacks import StepProgressBar

    out, before = io.StringIO(), time.time()
    progress = StepProgressBar()
    progress.train_progress_bar = Tqdm(file=out, desc="train", bar_format="{n_fmt}/{total_fmt} {rate_fmt}")
    progress._count_steps(SimpleNamespace(global_step=20, max_steps=200))
    bar = progress.train_progress_bar
    assert (bar.n, bar.initial, bar.total) == (20, 20, 200)
    assert "20/200" in out.getvalue() and "0/200" not in out.getvalue().replace("20/200", "")
    assert bar.start_t >= before  # the rate counts this start's steps over this start's time


def test_the_validation_bar_is_drawn_only_on_a_terminal(monkeypatch):
    """Written to a file, the validation bar is off (in a log it is cursor codes between the lines)."""
    import sys

    from klalm.train.callbacks import StepProgressBar

    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert StepProgressBar().init_validation_tqdm().disable


def test_the_train_bar_is_created_with_its_steps(monkeypatch):
    """The bar is created knowing the step count and the start step: Lightning's own drew "train: 0/?" first."""
    import io
    import sys
    from types import SimpleNamespace

    from klalm.train.callbacks import StepProgressBar

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    progress = StepProgressBar()
    monkeypatch.setattr(StepProgressBar, "trainer", SimpleNamespace(global_step=20, max_steps=200))
    bar = progress.init_train_tqdm()
    assert (bar.n, bar.total) == (20, 200)
    assert "/?" not in out.getvalue() and "20/200" in out.getvalue()
