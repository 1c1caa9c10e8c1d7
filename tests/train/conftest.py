"""Helpers for the training tests: compose `train.yaml` in-process, and run `klalm-train` as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

import klalm.train.app  # noqa: F401  (registers the config resolvers)

# A ~50k-parameter KLA model on 16-token random sequences: 8 tokens/s-scale work, deterministic on the CPU.
TINY = [
    "experiment=bench",
    "model=kla_tiny",
    "model.d_model=32",
    "model.n_layers=2",
    "trainer=cpu",
    "trainer.deterministic=true",
    "trainer.log_every_n_steps=1",
    "data.vocab_size=128",
    "data.seq_len=16",
    "data.batch_size=2",
    "train.global_batch_tokens=64",
    "train.max_tokens=256",
]

# Environment of subprocess runs: one thread, and MKL's reproducible mode so that two processes produce
# bit-identical float32 results (without it MKL's kernels depend on buffer alignment).
RUN_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_CBWR": "COMPATIBLE", "PYTHONUNBUFFERED": "1"}


def compose_train(overrides: list[str], run_dir: Path | None = None) -> DictConfig:
    """The composed train config (as `klalm-train` would see it) writing into `run_dir`.

    As with `hydra.run.dir=<log_dir>/<run_name>/<time>`, the log dir is taken to be two levels above `run_dir`.
    """
    extra = [f"paths.run_dir={run_dir}", f"paths.log_dir={run_dir.parent.parent}"] if run_dir is not None else []
    with initialize_config_module("klalm.configs", version_base="1.3"):
        return compose("train", overrides=overrides + extra)


def train_cmd(overrides: list[str], run_dir: Path | None) -> list[str]:
    """`python -m klalm.train <overrides>` writing into `run_dir` (None: the folder klalm-train chooses)."""
    folder = [] if run_dir is None else [f"hydra.run.dir={run_dir}"]
    return [sys.executable, "-m", "klalm.train", *overrides, *folder]


def run_train(overrides: list[str], run_dir: Path | None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `klalm-train` to completion in a subprocess; fails the test with its output if it fails."""
    proc = subprocess.run(train_cmd(overrides, run_dir), env=RUN_ENV, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"klalm-train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc
