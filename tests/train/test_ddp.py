"""2-process DDP and FSDP2 on the CPU (gloo), launched by scripts/launch_torchrun.sh, match one process with the same
global batch: each rank reads half of every global batch (rank-strided samples) in 2 accumulated micro-batches
(gradient sync only on the last), the single process reads it in 4, so the averaged gradients are the same."""

import csv
import os
import signal
import subprocess
import time

import pytest
import torch

from klalm.models.checkpoint import checkpoint_step, find_latest, list_checkpoints

from .conftest import RUN_ENV, TINY, interrupt_at_checkpoint, run_train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OVERRIDES = [
    *TINY,
    "train.global_batch_tokens=128",
    "train.max_tokens=768",
    "callbacks=default",
    "callbacks.sampler=null",
    "callbacks.progress=null",
]


def _losses(run_dir) -> list[float]:
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        return [float(r["train/loss"]) for r in csv.DictReader(handle) if r["train/loss"]]


def _steps(run_dir) -> list[str]:
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        return [r["step"] for r in csv.DictReader(handle) if r["train/loss"]]


def _weights(run_dir) -> dict[str, torch.Tensor]:
    return torch.load(find_latest([run_dir]), map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("trainer", "model", "fused"),
    # Fused AdamW: the sync-free step hands the fused kernel its found_inf flag beside FSDP2's sharded parameters.
    [
        ("ddp", "kla_tiny", "null"),
        ("fsdp", "gpt_tiny", "null"),
        ("fsdp", "gpt_tiny", "true"),
        ("fsdp", "kla_tiny", "null"),
    ],
)
def test_two_process_run_matches_one_process(tmp_path, trainer, model, fused):
    overrides = [*OVERRIDES, f"model={model}", f"optim.fused={fused}"]
    single = tmp_path / "single"
    run_train([*overrides, "run_name=single"], single)

    env = {**RUN_ENV, "NPROC_PER_NODE": "2", "TRAINER": trainer, "KLALM_RUN_ID": "two", "MASTER_PORT": "29517"}
    cmd = [
        os.path.join(REPO, "scripts", "launch_torchrun.sh"),
        *overrides,
        f"run_name={trainer}",
        f"paths.log_dir={tmp_path}",
        "trainer.accelerator=cpu",
        "trainer.precision=32-true",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    two = tmp_path / trainer / "two"
    assert "accumulate 2 × micro-batch 2×16 × 2 ranks" in proc.stderr + proc.stdout  # 1 process: 4 micro-batches
    assert (two / "summary.json").is_file()

    single_losses, two_losses = _losses(single), _losses(two)
    assert len(single_losses) == len(two_losses) == 6
    torch.testing.assert_close(torch.tensor(two_losses), torch.tensor(single_losses), rtol=1e-5, atol=1e-6)
    ref, got = _weights(single), _weights(two)  # the FSDP checkpoint holds full (gathered) tensors
    assert ref.keys() == got.keys()
    for name in ref:
        # Adam turns last-bit gradient differences of near-zero gradients into ~1e-6 weight differences
        torch.testing.assert_close(got[name], ref[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "name", "code"), [(signal.SIGTERM, "SIGTERM", 143), (signal.SIGINT, "Ctrl-C", 130)])
def test_stop_signal_under_ddp_saves_once_and_resumes_on_one_process(tmp_path, sig, name, code):
    """torchrun forwards SIGTERM (SIGINT) to every rank; they agree, write one checkpoint and stop; the launcher
    exits 143 (130), as each rank does (torchrun alone: 1, as after a crash); a single process resumes."""
    overrides = [*OVERRIDES, "train.max_tokens=1280000", "callbacks.checkpoint.every_n_steps=0", "run_name=pre",
                 f"paths.log_dir={tmp_path}", "logger.csv.flush_logs_every_n_steps=1"]  # fmt: skip
    ranks = tmp_path / "ranks"  # torchrun's own per-rank output files, through the launcher's TORCHRUN_ARGS
    env = {**RUN_ENV, "NPROC_PER_NODE": "2", "TRAINER": "ddp", "KLALM_RUN_ID": "two",
           "TORCHRUN_ARGS": f"--log-dir {ranks} --tee 3"}  # fmt: skip
    cmd = [os.path.join(REPO, "scripts", "launch_torchrun.sh"), *overrides, "trainer.accelerator=cpu",
           "trainer.precision=32-true"]  # fmt: skip
    console = tmp_path / "console.txt"  # files, not pipes: nothing reads a pipe until the run ends (64 KiB stall it)
    with console.open("w") as out, (tmp_path / "console_stderr.txt").open("w") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
    metrics = tmp_path / "pre" / "two" / "csv" / "metrics.csv"
    deadline = time.time() + 300
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) > 3):
        assert proc.poll() is None and time.time() < deadline, "the DDP run ended or stalled before the signal"
        time.sleep(0.1)
    # to the torchrun agent (exec'd by the launcher), which forwards it; a terminal's Ctrl-C reaches the agent alone
    # too (torchrun starts each rank in a session of its own)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    stderr = (tmp_path / "console_stderr.txt").read_text()
    assert proc.returncode == code, stderr[-4000:]
    assert f"ranks' exit codes {{0: {code}, 1: {code}}}; exit code {code}" in stderr  # klalm.train.torchrun's line
    assert console.read_text().count(f"stopped by {name}") == 2  # each rank logs to its console
    (rank0,) = ranks.glob("*/attempt_0/0/stdout.log")
    (rank1,) = ranks.glob("*/attempt_0/1/stdout.log")
    assert f"stopped by {name}" in rank0.read_text() and f"stopped by {name}" in rank1.read_text()
    app_log = (tmp_path / "pre" / "two" / "train.log").read_text()  # global rank 0 only
    assert app_log.count(f"stopped by {name}") == 1, app_log[-4000:]
    saved = list_checkpoints(tmp_path / "pre" / "two")
    assert len(saved) == 1 and 0 < checkpoint_step(saved[0]) < 20000

    resumed = tmp_path / "pre" / "one"
    stop = checkpoint_step(saved[0]) + 2
    run_train([*overrides, "resume=auto", "resume_allow_changes=true", f"train.max_tokens={stop * 128}"], resumed)
    assert [int(s) for s in _steps(resumed)] == [stop - 1, stop]


@pytest.mark.slow
def test_ctrl_c_under_lightnings_ddp_saves_once_and_stops(tmp_path):
    """`trainer=ddp` started by Lightning itself (no torchrun): a terminal's Ctrl-C reaches every rank; they agree
    at a step boundary, save one checkpoint and stop with exit code 130 (rank 0 forwards SIGTERM to the ranks it
    started, not a Ctrl-C: they got that one already)."""
    import sys

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "klalm.train", *TINY, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
           "trainer.precision=32-true", "train.max_tokens=64000", "callbacks=default", "callbacks.sampler=null",
           "callbacks.progress=null", "callbacks.checkpoint.every_n_steps=4", f"hydra.run.dir={run_dir}"]  # fmt: skip
    code, stderr = interrupt_at_checkpoint(cmd, run_dir, 8, signal.SIGINT, group=True)
    assert code == 130, stderr[-3000:]
    assert 8 <= checkpoint_step(find_latest([run_dir])) < 1000
    assert "stopped by Ctrl-C" in (run_dir / "train.log").read_text()
