"""Sweeps: a Hydra multirun gives each job its own run dir and ends with a summary table across the jobs."""

import json
import subprocess
import sys

import pytest

from klalm.train.sweep import summary_table

from .conftest import RUN_ENV, TINY


def _fake_job(folder, summary, overrides):
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))


def test_summary_table_has_one_row_per_job_and_shows_failures(tmp_path):
    ok = {"run_name": "a", "params": 1234, "steps": 10, "tokens_seen": 640, "train/loss": 3.5, "val_loss": 3.25,
          "val_ppl": 25.79, "perf/tokens_per_s": 1000.0, "wall_s": 4.2}  # fmt: skip
    _fake_job(tmp_path / "0_a", ok, ["experiment=x", "optim.lr=1e-3"])
    _fake_job(tmp_path / "1_a", None, ["experiment=x", "optim.lr=3e-3"])
    lines = summary_table(tmp_path).splitlines()
    assert len(lines) == 4  # header, separator, two jobs
    assert lines[2] == "| 0_a | a | 1,234 | 10 | 640 | 3.5000 | 3.2500 | 25.79 | 1,000 | — | 4.2 | optim.lr=1e-3 |"
    assert lines[3].startswith("| 1_a | no summary.json") and lines[3].endswith("optim.lr=3e-3 |")


@pytest.mark.slow
def test_two_config_multirun_writes_job_dirs_and_summary(tmp_path):
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "klalm.train", "-m", *TINY, "optim.lr=0.001,0.003", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(cmd, env=RUN_ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name for p in jobs] == ["0_bench", "1_bench"]
    for job, lr in zip(jobs, ("0.001", "0.003")):
        assert json.loads((job / "summary.json").read_text())["steps"] == 4
        assert (job / "csv" / "metrics.csv").is_file()
        assert f"optim.lr={lr}" in (job / ".hydra" / "overrides.yaml").read_text()
    table = (sweep_dir / "summary.md").read_text().splitlines()
    assert len(table) == 4 and table[2].endswith("| optim.lr=0.001 |") and table[3].endswith("| optim.lr=0.003 |")


@pytest.mark.slow
def test_a_refused_job_fails_alone_and_the_summary_shows_it(tmp_path):
    """In a sweep a refused job (here its token budget) fails as any failing job does, the next job still runs, and
    summary.md, written after every job, has both rows although Hydra ends such a sweep by raising."""
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "klalm.train", "-m", *TINY, "train.global_batch_tokens=100,64",
           f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    proc = subprocess.run(cmd, env=RUN_ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert (
        "refused: train.global_batch_tokens=100 is not a multiple" in (sweep_dir / "0_bench" / "train.log").read_text()
    )
    assert json.loads((sweep_dir / "1_bench" / "summary.json").read_text())["steps"] == 4
    table = (sweep_dir / "summary.md").read_text().splitlines()
    assert table[2].startswith("| 0_bench | no summary.json") and table[3].startswith("| 1_bench | bench |")
