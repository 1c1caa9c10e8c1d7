"""2-process DDP on the CPU (gloo), launched by scripts/launch_torchrun.sh, matches one process with the same global
batch: each rank reads half of every global batch (rank-strided samples) in 2 accumulated micro-batches (gradient sync
only on the last), the single process reads it in 4, so the averaged gradients are the same."""

import csv
import os
import subprocess

import pytest
import torch

from klalm.train.checkpoint import find_latest

from .conftest import RUN_ENV, TINY, run_train

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


def _weights(run_dir) -> dict[str, torch.Tensor]:
    return torch.load(find_latest([run_dir]), map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(tmp_path):
    single = tmp_path / "single"
    run_train([*OVERRIDES, "run_name=single"], single)

    env = {**RUN_ENV, "NPROC_PER_NODE": "2", "TRAINER": "ddp", "KLALM_RUN_ID": "ddp2", "MASTER_PORT": "29517"}
    cmd = [
        os.path.join(REPO, "scripts", "launch_torchrun.sh"),
        *OVERRIDES,
        "run_name=ddp",
        f"paths.log_dir={tmp_path}",
        "trainer.accelerator=cpu",
        "trainer.precision=32-true",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    ddp = tmp_path / "ddp" / "ddp2"
    assert "accumulate 2 × micro-batch 2×16 × 2 ranks" in proc.stderr + proc.stdout  # 1 process: 4 micro-batches
    assert (ddp / "summary.json").is_file()

    single_losses, ddp_losses = _losses(single), _losses(ddp)
    assert len(single_losses) == len(ddp_losses) == 6
    torch.testing.assert_close(torch.tensor(ddp_losses), torch.tensor(single_losses), rtol=1e-5, atol=1e-6)
    ref, got = _weights(single), _weights(ddp)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-4, atol=1e-6, msg=name)
