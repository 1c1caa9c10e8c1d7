"""StepMetrics' CUDA memory columns, checked on the CPU with the allocator's counters patched."""

from __future__ import annotations

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
