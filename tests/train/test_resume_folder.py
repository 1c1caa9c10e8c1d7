"""A resumed run continues in its own run folder: one metrics.csv (earlier rows kept, the steps after the checkpoint
logged once), one loss.png; metrics are flushed at every checkpoint, so a kill loses no row the checkpoint covers."""

import csv
import json
import os
import signal
from glob import glob

from klalm.train.app import run
from klalm.train.checkpoint import RollingCheckpoint
from klalm.train.csv_logger import ContinuingCSVLogger
from klalm.train.rundir import run_dir_for

from .conftest import TINY, compose_train, interrupt_at_checkpoint, run_train, train_cmd
from .test_checkpoint import FakeTrainer

STEPS = 24
# Rows reach the file only through the checkpoints' flushes (flush_logs_every_n_steps is never reached).
OVERRIDES = [*TINY, f"train.max_tokens={STEPS * 64}", "run_name=f", "callbacks=default", "callbacks.sampler=null",
             "callbacks.progress=null", "callbacks.checkpoint.every_n_steps=4", "train.plot=true",
             "logger.csv.flush_logs_every_n_steps=1000"]  # fmt: skip


def _rows(run_dir):
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _kill_after_checkpoint(log_dir, step: int):
    """Starts a run in a new folder under `log_dir`, SIGKILLs it once its checkpoint of `step` exists."""
    interrupt_at_checkpoint(train_cmd([*OVERRIDES, f"paths.log_dir={log_dir}"], None), log_dir / "f" / "*", step,
                            signal.SIGKILL)  # fmt: skip
    (run_dir,) = (log_dir / "f").iterdir()
    return run_dir


def test_a_killed_run_resumes_in_its_own_folder_with_one_metrics_table(tmp_path):
    run_dir = _kill_after_checkpoint(tmp_path, step=4)
    saved = [int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*.ckpt")]
    last_saved = max(saved)
    assert last_saved < STEPS, "the run finished before the kill; nothing was tested"
    logged = [int(r["step"]) for r in _rows(run_dir) if r["train/loss"]]
    assert set(range(1, last_saved + 1)) <= set(logged)  # every row the checkpoint covers was on disk

    run_train([*OVERRIDES, f"paths.log_dir={tmp_path}", "resume=auto"], None)  # the folder is not named
    assert list((tmp_path / "f").iterdir()) == [run_dir]  # no second folder
    steps = [int(r["step"]) for r in _rows(run_dir) if r["train/loss"]]
    assert steps == list(range(1, STEPS + 1))  # earlier rows kept, the rest once each, in order
    assert (run_dir / "loss.png").is_file() and (run_dir / "summary.json").is_file()
    assert "resume: null" in (run_dir / ".hydra" / "config.yaml").read_text()  # the first start's record is kept
    (restart,) = (run_dir / ".hydra").glob("resume-*")
    assert "resume: auto" in (restart / "config.yaml").read_text()


def test_resume_auto_reads_the_run_name_literally(tmp_path):
    """paths.resume_glob escapes the log folder and run_name: run_name "g[1]" once searched outputs/g1/* (and missed
    its own checkpoints, starting afresh in a second folder), run_name "*" every run's."""
    own, other = tmp_path / "g[1]" / "a", tmp_path / "g1" / "b"
    own.mkdir(parents=True)
    other.mkdir(parents=True)
    cfg = compose_train([*TINY, 'run_name="g[1]"', f"paths.log_dir={tmp_path}"])
    assert glob(cfg.paths.resume_glob) == [str(own)]


def test_a_resumed_finished_run_keeps_its_summary(tmp_path):
    """resume=<folder> of a finished run trains no step: its summary keeps the last logged train/loss and perf/*
    values and the earlier wall time (it once lost them, and said wall_s 0.2)."""
    run_dir = tmp_path / "f" / "done"
    overrides = [*TINY, "callbacks=default", "callbacks.sampler=null", "callbacks.progress=null",
                 "train.final_eval=true"]  # fmt: skip
    first = run(compose_train(overrides, run_dir))
    again = run(compose_train([*overrides, f"resume={run_dir}"], run_dir))
    assert first["train/loss"] > 0 and first["perf/tokens_per_s"] > 0
    assert {k: v for k, v in again.items() if k != "wall_s"} == {k: v for k, v in first.items() if k != "wall_s"}
    assert again["wall_s"] >= first["wall_s"]
    assert json.loads((run_dir / "summary.json").read_text()) == again


def test_the_run_folder_follows_the_resume_setting(tmp_path):
    base = str(tmp_path / "r")
    older, newer = tmp_path / "r" / "old", tmp_path / "r" / "new"
    for run_dir, step in ((older, 8), (newer, 4)):
        run_dir.mkdir(parents=True)
        RollingCheckpoint(run_dir / "checkpoints").save(FakeTrainer(step))
    for path in (older / "checkpoints").iterdir():  # written a minute before the other run's
        os.utime(path, (path.stat().st_atime - 60, path.stat().st_mtime - 60))
    glob = f"{base}/*"
    assert run_dir_for(base, None, glob, "job42") == f"{base}/job42"
    assert run_dir_for(base, None, glob, None).startswith(f"{base}/20")  # <time>_<hex>
    assert run_dir_for(base, str(newer), glob, "job42") == str(newer)
    # the folder of the checkpoint it resumes from: the run that wrote one last, though the other has more steps
    assert run_dir_for(base, "auto", glob, "job42") == str(newer)
    assert run_dir_for(str(tmp_path / "none"), "auto", f"{tmp_path}/none/*", "job42") == f"{tmp_path}/none/job42"


def test_the_csv_logger_keeps_earlier_rows_and_drops_those_past_the_start(tmp_path):
    first = ContinuingCSVLogger(tmp_path, name="csv", version="")
    for step in (1, 2, 3, 4):
        first.log_metrics({"train/loss": float(step)}, step=step)
    first.save()
    second = ContinuingCSVLogger(tmp_path, name="csv", version="")  # a resume from step 2 (rows 3, 4: a lost tail)
    second.drop_rows_after(2)
    for step in (3, 4):
        second.log_metrics({"train/loss": 10.0 + step, "val/loss": 1.0}, step=step)  # a new column too
    second.save()
    rows = _rows(tmp_path)
    assert [(int(r["step"]), float(r["train/loss"])) for r in rows] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]
    assert [r["val/loss"] for r in rows] == ["", "", "1.0", "1.0"]
