"""Helpers for the training tests: compose `train.yaml` in-process, and run `klalm-train` as a subprocess."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
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


def interrupt_at_checkpoint(cmd: list[str], run_dir: Path, step: int, sig: int, *, group: bool = False,
                            timeout: float = 240) -> tuple[int, str]:  # fmt: skip
    """Starts `cmd` and sends `sig` once the checkpoint of `step` exists in `run_dir` (which may end in a glob, `*`,
    for a folder the run names itself), to the run's whole process group with `group` (as a terminal's Ctrl-C
    reaches every process), else to the run alone; returns (exit code, stderr). Fails the test if the run ends first
    or never gets there."""
    proc = subprocess.Popen(cmd, env=RUN_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=group)  # fmt: skip
    target, deadline = f"{run_dir.name}/checkpoints/step-{step:08d}.ckpt", time.time() + timeout
    try:
        while not list(run_dir.parent.glob(target)):
            if proc.poll() is not None:
                pytest.fail(f"the run ended before step {step}:\n{proc.stderr.read()[-4000:]}")
            if time.time() > deadline:
                pytest.fail(f"no checkpoint {target} after {timeout:.0f} s")
            time.sleep(0.02)
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        stderr = proc.communicate(timeout=120)[1]
    finally:  # whatever happened, leave no process behind (a DDP rank, a loader worker)
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            elif proc.poll() is None:
                proc.kill()
    return proc.returncode, stderr
