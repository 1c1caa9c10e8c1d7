"""One writer per run folder: unique folder names, a lock that refuses a second writer (and outlives no dead one),
pruning that tolerates vanished files, and stale temporary files removed by the next run in the folder."""

import csv
import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from klalm.models import checkpoint as reader
from klalm.models.checkpoint import find_latest
from klalm.train import checkpoint as writer
from klalm.train.app import run
from klalm.train.checkpoint import RollingCheckpoint
from klalm.train.rundir import LOCK_FILE, RunDirInUseError, lock_run_dir, unlock_run_dir

from .conftest import RUN_ENV, TINY, compose_train
from .test_checkpoint import FakeTrainer

WITH_CKPT = [*TINY, "callbacks=default", "callbacks.sampler=null", "callbacks.progress=null"]


def _hold_lock(run_dir: Path) -> subprocess.Popen:
    """A separate process that holds `run_dir`'s lock until it is killed."""
    code = (
        "import sys, time; from klalm.train.rundir import lock_run_dir; "
        "lock_run_dir(sys.argv[1]); print('locked', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], env=RUN_ENV, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_runs_started_together_get_their_own_folders(tmp_path):
    """Two klalm-train with the same run_name, started at once, write two complete runs (they once shared one)."""
    cmd = [sys.executable, "-m", "klalm.train", *TINY, "run_name=twin", f"paths.log_dir={tmp_path}"]
    procs = [subprocess.Popen(cmd, env=RUN_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
    folders = sorted((tmp_path / "twin").iterdir())
    assert len(folders) == 2
    for folder in folders:
        with open(folder / "csv" / "metrics.csv", newline="") as handle:
            steps = [int(r["step"]) for r in csv.DictReader(handle) if r["train/loss"]]
        assert steps == [1, 2, 3, 4]  # one run's rows each, none interleaved


def test_a_second_writer_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path, caplog):
    run_dir = tmp_path / "r" / "shared"
    holder = _hold_lock(run_dir)
    try:
        with pytest.raises(RunDirInUseError, match=rf"{run_dir} is in use by another klalm-train \(pid {holder.pid} "):
            run(compose_train(WITH_CKPT, run_dir))
        assert not (run_dir / "checkpoints").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with caplog.at_level(logging.WARNING):
        run(compose_train(WITH_CKPT, run_dir))  # the killed holder's lock does not block the folder
    assert any(f"previous writer (pid {holder.pid} " in r.getMessage() for r in caplog.records)
    assert find_latest([run_dir]) is not None
    assert (run_dir / LOCK_FILE).read_text() == ""  # released cleanly


def test_the_command_line_refuses_before_touching_the_folder(tmp_path):
    """The lock is taken before Hydra writes `.hydra/`: the refused run leaves the holder's config record alone."""
    run_dir = tmp_path / "r" / "shared"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("the first run's config\n")
    holder = _hold_lock(run_dir)
    try:
        cmd = [sys.executable, "-m", "klalm.train", *TINY, f"hydra.run.dir={run_dir}"]
        proc = subprocess.run(cmd, env=RUN_ENV, capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode != 0
    assert f"is in use by another klalm-train (pid {holder.pid} " in proc.stderr
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "the first run's config\n"
    assert not (run_dir / "app.log").exists()


def test_the_lock_is_reentrant_in_one_process(tmp_path):
    lock_run_dir(tmp_path)
    lock_run_dir(tmp_path)  # the Hydra callback and the app both take it
    unlock_run_dir(tmp_path)
    holder = _hold_lock(tmp_path)  # released: another process gets it
    holder.kill()
    holder.wait()


def test_stale_temporary_files_are_removed_by_the_next_run_in_the_folder(tmp_path, caplog):
    run_dir = tmp_path / "r" / "a"
    stale = run_dir / "checkpoints" / ".step-00000008.ckpt.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x" * 1024)
    with caplog.at_level(logging.WARNING):
        run(compose_train(TINY, run_dir))  # saves no checkpoint itself (experiment=bench)
    assert not stale.exists()
    assert any("did not finish" in r.getMessage() for r in caplog.records)


def test_discovery_and_pruning_tolerate_files_that_vanish(tmp_path, monkeypatch):
    """Checkpoints deleted between a listing and its use (a reader racing the run's pruning, or a second writer
    before the lock existed) are passed over, not a crash."""
    for step in (10, 20):
        RollingCheckpoint(tmp_path / "checkpoints", keep_last=2).save(FakeTrainer(step))
    real_list = reader.list_checkpoints

    def list_then_vanish(run_dir):
        found = real_list(run_dir)
        for path in found[:-1]:
            path.unlink()
        return found

    for module in (reader, writer):  # discovery reads through the one, pruning through the other
        monkeypatch.setattr(module, "list_checkpoints", list_then_vanish)
    assert find_latest([tmp_path]).name == "step-00000020.ckpt"  # step 10 vanished while it looked
    RollingCheckpoint(tmp_path / "checkpoints", keep_last=1).save(FakeTrainer(30))  # prunes step 20, already gone
    assert [p.name for p in real_list(tmp_path)] == ["step-00000030.ckpt"]
