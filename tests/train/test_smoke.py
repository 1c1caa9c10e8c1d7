"""`klalm-train experiment=smoke` end to end through the console script, on the offline Python-docs corpus."""

import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from klalm.models.checkpoint import find_latest, load_model

from .conftest import RUN_ENV


@pytest.mark.slow
def test_smoke_experiment_end_to_end(tmp_path):
    exe = shutil.which("klalm-train", path=str(Path(sys.executable).parent))
    assert exe, "the klalm-train console script is not installed"
    run_dir = tmp_path / "smoke"
    started = time.time()
    proc = subprocess.run([exe, "experiment=smoke", f"hydra.run.dir={run_dir}"], env=RUN_ENV, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-5000:]
    print(f"smoke run: {time.time() - started:.0f} s wall")

    assert find_latest([run_dir]) is not None
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        losses = [float(r["train/loss"]) for r in csv.DictReader(handle) if r["train/loss"]]
    assert len(losses) == 10 and losses[-1] < losses[0]  # logged every 2 of 20 steps; the loss falls
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["val_loss"] < losses[0]
    assert (run_dir / "samples.txt").read_text().startswith("=== step 20 ===")
    assert (run_dir / "loss.png").is_file()
    model, tokenizer = load_model(run_dir)  # the HF export with its tokenizer
    ids = tokenizer("def f(x):", return_tensors="pt")["input_ids"]
    assert torch.isfinite(model(ids).logits).all()
