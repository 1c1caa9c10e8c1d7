"""What a user sees and what the loggers get: one `klalm-train` subprocess on tiny synthetic data, all loggers on."""

from __future__ import annotations

import subprocess

import yaml

from .conftest import RUN_ENV, TINY, train_cmd


def test_console_shows_steps_and_tokens_per_s_without_noise_and_loggers_get_the_config(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [*TINY, "callbacks=default", "callbacks.sampler=null", "callbacks.progress.refresh_rate=1",
                 "trainer.enable_progress_bar=true", "logger=all"]  # fmt: skip
    env = {**RUN_ENV, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    proc = subprocess.run(train_cmd(overrides, run_dir), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    console = proc.stdout + proc.stderr
    assert "train: 100%|" in console and "| 4/4 [" in console and "tok/s=" in console  # optimiser steps
    assert "loss=" in console  # StepMetrics' latest loss (no Lightning `self.log` in the step)
    for noise in ("Epoch 0", "litlogger", "set_vital", "LeafSpec", "dataloader_iter", "v_num"):
        assert noise not in console, noise
    assert console.count("Seed set to 1234") == 1  # Lightning's lines are no longer printed twice

    for hparams in (run_dir / "csv" / "hparams.yaml", run_dir / "tb" / "hparams.yaml"):
        saved = yaml.safe_load(hparams.read_text())
        assert saved["train"]["global_batch_tokens"] == 64 and saved["model"]["d_model"] == 32
        assert saved["callbacks"]["checkpoint"]["dirpath"] == f"{run_dir}/checkpoints"  # resolved
    (wandb_run,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    assert b"global_batch_tokens" in wandb_run.read_bytes()  # the config record of the offline run
