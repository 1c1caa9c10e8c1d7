"""One writer per run folder: unique folder names, a lock that refuses a second writer (and outlives no dead one),
pruning that tolerates vanished files, and stale temporary files removed by the next run in the folder."""

import csv
import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from klalm.models import checkpoint as reader
from klalm.models.checkpoint import find_latest
from klalm.train import checkpoint as writer
from klalm.train.app import run
from klalm.train.checkpoint import RollingCheckpoint
from klalm.train.rundir import (
    LOCK_FILE,
    LockRunDir,
    RunDirInUseError,
    RunDirTakenError,
    check_run_dir_free,
    lock_run_dir,
    new_folder,
    remove_run_folder,
    unlock_run_dir,
)

from .conftest import RUN_ENV, TINY, compose_train, train_cmd
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


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_start_that_does_not_continue_the_run_in_its_folder_is_refused_and_changes_nothing(tmp_path):
    """A finished run's folder given as hydra.run.dir to a fresh start (or to one resuming another folder's
    checkpoint): one line naming the folder, and every file as it was (the start once overwrote the checkpoints,
    export, config record and summary, with another model). A start continuing that run is let in."""
    run_dir, other = tmp_path / "r" / "done", tmp_path / "r" / "other"
    run(compose_train(WITH_CKPT, run_dir))
    run(compose_train(WITH_CKPT, other))
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text("the first run's config\n")
    before = _files(run_dir)
    proc = subprocess.run(train_cmd([*TINY, "model=gpt_tiny"], run_dir), env=RUN_ENV, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"klalm-train: run folder {run_dir} already holds a run (checkpoints and summary.json), which this start "
        f"would overwrite: continue it with resume={run_dir}, or start in another folder (hydra.run.dir)"
    )
    elsewhere = find_latest([other])
    for resume in ([], [f"resume={elsewhere}", "resume_allow_changes=true"]):  # in the app too (sweep jobs)
        with pytest.raises(RunDirTakenError, match=f"run folder {run_dir} already holds a run"):
            run(compose_train([*WITH_CKPT, *resume], run_dir))
    assert _files(run_dir) == before
    check_run_dir_free(run_dir, find_latest([run_dir]))  # a resume from its own checkpoint


def test_a_folder_holding_what_a_refused_start_wrote_is_free_and_other_ranks_do_not_judge(tmp_path, monkeypatch):
    for name in (".hydra/config.yaml", "train.log", LOCK_FILE, "tokenizer/tokenizer.json",
                 "checkpoints/.step-00000002.ckpt.tmp"):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    check_run_dir_free(tmp_path, None)
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(RunDirTakenError, match=r"holds a run \(summary.json\)"):
        check_run_dir_free(tmp_path, None)
    monkeypatch.setenv("RANK", "1")  # rank 0 decides (another rank may start after it wrote its first files)
    check_run_dir_free(tmp_path, None)


@pytest.mark.parametrize("resume", [[], ["resume=auto"]], ids=["fresh", "resume"])
def test_only_global_rank_zero_records_the_config_and_the_log(tmp_path, resume):
    """Every rank under torchrun composes the config; only rank 0 writes `.hydra/` (or `.hydra/resume-*`), as
    Lightning's own launcher has its ranks do, and train.log. Another rank once wrote its record into the folder too:
    `.hydra/` over an earlier run's, which rank 0 was about to refuse to overwrite, or one more `resume-*` folder per
    rank; and appended its log lines (here the refusal and its traceback) to the folder's train.log."""
    record = tmp_path / ".hydra" / "config.yaml"
    record.parent.mkdir()
    record.write_text("the first run's config\n")
    proc = subprocess.run(train_cmd([*TINY, "model.d_model=-3", *resume], tmp_path), env={**RUN_ENV, "RANK": "1"},
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].endswith(
        "model.d_model=-3 is invalid: must be > 0"
    )
    assert _files(tmp_path / ".hydra") == {"config.yaml": b"the first run's config\n"}
    assert not (tmp_path / "train.log").exists()


def test_a_resume_of_the_folder_is_free_also_through_a_symlinked_checkpoints_folder(tmp_path):
    run, scratch = tmp_path / "run", tmp_path / "scratch"
    (scratch / "ck").mkdir(parents=True)
    run.mkdir()
    (run / "checkpoints").symlink_to(scratch / "ck")  # checkpoints on another disk, as on many clusters
    (run / "summary.json").write_text("{}")
    check_run_dir_free(run, run / "checkpoints" / "step-00000004.ckpt")
    with pytest.raises(RunDirTakenError):
        check_run_dir_free(run, tmp_path / "other" / "checkpoints" / "step-00000004.ckpt")


@pytest.mark.parametrize("below", ["", "sub/run"], ids=["a-file", "below-a-file"])
def test_a_run_folder_that_cannot_be_created_is_refused_in_one_line(tmp_path, below):
    """hydra.run.dir (or paths.log_dir) naming a file: one line, not Hydra's warning and a mkdir traceback."""
    file = tmp_path / "afile"
    file.write_text("")
    folder = file / below if below else file
    config = OmegaConf.create({"hydra": {"run": {"dir": str(folder)}}, "resume": None})
    with pytest.raises(SystemExit, match=f"^klalm-train: cannot create the run folder {folder}: {file} is a file$"):
        LockRunDir().on_run_start(config)


def test_a_run_refused_once_it_had_begun_leaves_no_folder(tmp_path):
    """A bad record met at the first step, after the tokenizer and the CSV logger's hparams.yaml were written: one
    line, and the fresh run folder is gone (they once kept it)."""
    (tmp_path / "good.txt").write_text("a few words of good text here.\n")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe not utf-8")
    overrides = ["experiment=smoke", "debug=fast", "data=files", f"data.train=[{tmp_path}/good.txt,{tmp_path}/bad.txt]",
                 "data.tokenizer=bpe", "data.bpe_vocab_size=300", f"data.cache_dir={tmp_path / 'cache'}",
                 "data.num_workers=0", "data.shuffle=false", "run_name=r",
                 f"paths.log_dir={tmp_path / 'out'}"]  # fmt: skip
    proc = subprocess.run(train_cmd(overrides, None), env=RUN_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"klalm-train: bad record at {tmp_path / 'bad.txt'}")
    assert line.endswith("(set data.on_bad_record=skip to skip and count such records)")  # klalm-train's spelling
    assert not (tmp_path / "out" / "r").exists()


def test_an_unused_run_folder_goes_with_the_folders_its_start_created_and_no_other(tmp_path):
    """`remove_run_folder` (a refused start) removes the folders above the run folder that this process created,
    while empty; a folder that was there stays, and so does a link and what it points to (a log folder on another
    disk), which a first version resolved and removed, breaking every later run."""
    fresh = tmp_path / "new" / "name" / "run"
    new_folder(str(fresh))
    fresh.mkdir(parents=True)
    (fresh / "train.log").write_text("")
    remove_run_folder(fresh)
    assert not (tmp_path / "new").exists()
    (tmp_path / "there").mkdir()
    inside = tmp_path / "there" / "name" / "run"
    new_folder(str(inside))
    inside.mkdir(parents=True)
    remove_run_folder(inside)
    assert (tmp_path / "there").is_dir() and not (tmp_path / "there" / "name").exists()
    (tmp_path / "scratch").mkdir()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "eval").symlink_to(tmp_path / "scratch")
    linked = tmp_path / "logs" / "eval" / "run"
    new_folder(str(linked))
    linked.mkdir()
    remove_run_folder(linked)
    assert not linked.exists() and (tmp_path / "logs" / "eval").is_symlink() and (tmp_path / "scratch").is_dir()


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
