"""Which run a resume continues and for how long: resume=auto takes the run that wrote a checkpoint last (not the
one with the most steps), a changed budget counts from the checkpoint's tokens, and the data a run trained on
(`data=files`' training files, the loader's workers) cannot change under it."""

import logging
import os

import pytest

from klalm.config_checks import ConfigError
from klalm.data.loader import LoaderStateError
from klalm.models.checkpoint import find_latest, list_checkpoints, newest_valid
from klalm.train.app import USER_ERRORS, run
from klalm.train.rundir import run_dir_for

from .conftest import TINY, compose_train

RUN = [*TINY, "run_name=v", "callbacks=default", "callbacks.sampler=null", "callbacks.progress=null",
       "callbacks.checkpoint.every_n_steps=2", "callbacks.checkpoint.keep_last=2"]  # fmt: skip


def _age(run_dir, seconds):
    """Makes every checkpoint of a run look written `seconds` earlier."""
    for path in list_checkpoints(run_dir):
        stat = path.stat()
        os.utime(path, (stat.st_atime - seconds, stat.st_mtime - seconds))


def _stopped_at_step_2(run_dir):
    """A run that was stopped after its step-2 checkpoint: a finished 4-step run less what came after step 2."""
    run(compose_train(RUN, run_dir))
    for name in ("step-00000004.ckpt", "step-00000004.ckpt.sha256", "summary.json"):
        path = run_dir / ("checkpoints" if name.startswith("step") else "") / name
        path.unlink()


def test_resume_auto_continues_the_run_that_wrote_last_not_the_one_with_most_steps(tmp_path, caplog):
    """A finished run (step 4) and a later run of the same run_name stopped at step 2: resume=auto took the finished
    run's step 4, trained nothing and exited 0, and the stopped run was never continued."""
    finished, stopped = tmp_path / "v" / "a", tmp_path / "v" / "b"
    run(compose_train(RUN, finished))
    _age(finished, 60)
    _stopped_at_step_2(stopped)
    glob = f"{tmp_path / 'v'}/*"
    assert find_latest([finished, stopped]) == stopped / "checkpoints" / "step-00000002.ckpt"
    assert run_dir_for(str(tmp_path / "v"), "auto", glob, None) == str(stopped)
    summary = run(compose_train([*RUN, "resume=auto"], stopped))
    assert summary["steps"] == 4 and summary["tokens_seen"] == 256
    # both finished now; the run written last is at the end of its budget: said, and nothing trains
    with caplog.at_level(logging.WARNING):
        summary = run(compose_train([*RUN, "resume=auto"], stopped))
    assert summary["steps"] == 4
    assert any("its run is at the end of its budget (step 4 of 4)" in r.getMessage() for r in caplog.records)


def test_a_damaged_newest_checkpoint_falls_back_within_its_run_first(tmp_path):
    older, newer = tmp_path / "v" / "a", tmp_path / "v" / "b"
    run(compose_train(RUN, older))
    _age(older, 60)
    run(compose_train(RUN, newer))
    damaged = newer / "checkpoints" / "step-00000004.ckpt"
    damaged.write_bytes(damaged.read_bytes()[:-100])  # its .sha256 no longer matches
    latest, skipped = newest_valid([older, newer])
    assert latest == newer / "checkpoints" / "step-00000002.ckpt" and len(skipped) == 1 and str(damaged) in skipped[0]


def test_runs_written_at_the_same_time_go_by_step_then_name_and_a_jobs_own_folder_comes_first(tmp_path):
    """Equal times (a copy that kept none, a coarse file system): the older rule, highest step first, decides; a
    launcher's job (`$KLALM_RUN_ID`) requeued continues its own folder, whatever another run of the name wrote since."""
    base = tmp_path / "v"
    for name, steps in (("a", 9), ("b", 4)):
        (base / name / "checkpoints").mkdir(parents=True)
        (base / name / "checkpoints" / f"step-{steps:08d}.ckpt").write_bytes(b"x")
        os.utime(base / name / "checkpoints" / f"step-{steps:08d}.ckpt", (1e9, 1e9))
    assert find_latest([base / "a", base / "b"]) == base / "a" / "checkpoints" / "step-00000009.ckpt"
    job, other = base / "job1", base / "other"
    run(compose_train(RUN, job))
    _age(job, 60)
    run(compose_train(RUN, other))  # written since, by another run of the name
    assert run_dir_for(str(base), "auto", f"{base}/*", "job1") == str(job)
    assert run_dir_for(str(base), "auto", f"{base}/*", None) == str(other)


def test_a_larger_budget_and_global_batch_accepted_on_resume_train_the_tokens_left(tmp_path):
    """resume_allow_changes=true with twice the tokens and twice the global batch: 2 more steps of 128 tokens (it
    took max_tokens // global_batch_tokens = 4 steps in all, which the checkpoint had reached, and trained none)."""
    run_dir = tmp_path / "v" / "a"
    run(compose_train(RUN, run_dir))
    more = ["train.max_tokens=512", "train.global_batch_tokens=128", "resume_allow_changes=true", "resume=auto"]
    summary = run(compose_train([*RUN, *more], run_dir))
    assert (summary["steps"], summary["tokens_seen"]) == (6, 512)


@pytest.fixture
def files_run(tmp_path):
    """`data=files` over a small text file, with a BPE trained on it; returns (overrides, run folder, other file)."""
    words = [f"w{i % 97}{'ab'[i % 2]}" for i in range(6000)]
    (tmp_path / "a.txt").write_text(" ".join(words))
    (tmp_path / "b.txt").write_text(" ".join(reversed(words)))
    overrides = ["data=files", f"data.train={tmp_path / 'a.txt'}", "data.tokenizer=bpe", "data.bpe_vocab_size=300",
                 f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=16", "data.batch_size=2", "data.num_workers=0",
                 "model=kla_tiny", "model.d_model=32", "model.n_layers=2", "trainer=cpu", "train.max_tokens=128",
                 "train.global_batch_tokens=32", "train.final_eval=false", "train.export_hf=false",
                 *RUN[len(TINY):]]  # fmt: skip
    run_dir = tmp_path / "f" / "a"
    run(compose_train(overrides, run_dir))
    return overrides, run_dir, tmp_path / "b.txt"


def test_a_resume_on_other_training_files_is_refused_naming_them(files_run):
    """data=files keeps its files in data.train, which the checkpoint did not record: a resume on other files went on
    silently, applying the saved position in one file to another."""
    overrides, run_dir, other = files_run
    with pytest.raises(ConfigError, match=f"changes data.train '.*a.txt' -> '{other}'"):
        run(compose_train([*overrides, f"data.train={other}", f"resume={run_dir}"], run_dir))


def test_a_resume_with_other_loader_workers_is_a_one_line_refusal(files_run):
    overrides, run_dir, _ = files_run
    assert LoaderStateError in USER_ERRORS  # klalm-train prints it as one line
    with pytest.raises(LoaderStateError, match="saved with data.num_workers=0, this run has 1: resume with"):
        run(compose_train([*overrides, "data.num_workers=1", f"resume={run_dir}", "train.max_tokens=512",
                           "resume_allow_changes=true"], run_dir))  # fmt: skip


def test_a_checkpoint_older_than_a_resume_key_resumes_and_its_recorded_keys_are_still_checked(tmp_path):
    """A data=files checkpoint written before data.train and data.field were resume keys records neither: its resume
    is not refused for them ("(absent) -> 'a.jsonl'" named a change that never happened), while a key added under a
    recorded one (optim) still is."""
    from klalm.train.resume import check_settings

    saved = {"klalm": {"resume_settings": {"optim.lr": 1e-3, "data.source": None, "data.seq_len": 16}}}
    current = {"optim.lr": 1e-3, "data.source": None, "data.train": "a.jsonl", "data.field": "text", "data.seq_len": 16}
    check_settings(tmp_path / "old.ckpt", saved, current, allow_changes=False)
    with pytest.raises(ConfigError, match=r"changes optim.foo '\(absent\)' -> 1"):
        check_settings(tmp_path / "old.ckpt", saved, {**current, "optim.foo": 1}, allow_changes=False)
