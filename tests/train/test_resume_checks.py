"""resume verifies its checkpoint: a truncated or corrupted newest checkpoint is skipped (named, with the reason)
and the run falls back to the newest valid one; an explicit file that fails is refused, naming it."""

import csv
import logging
import os
from pathlib import Path

import pytest
import torch

from klalm.config_checks import ConfigError
from klalm.models.checkpoint import CheckpointError, list_checkpoints, newest_valid, verify_checkpoint
from klalm.train.app import run
from klalm.train.resume import check_model, check_tokenizer

from .conftest import TINY, compose_train

RUN = [*TINY, "run_name=v", "callbacks=default", "callbacks.sampler=null", "callbacks.progress=null",
       "callbacks.checkpoint.every_n_steps=2", "callbacks.checkpoint.keep_last=2"]  # fmt: skip


@pytest.fixture
def finished(tmp_path):
    """A finished 4-step run folder with checkpoints at steps 2 and 4."""
    run_dir = tmp_path / "v" / "a"
    run(compose_train(RUN, run_dir))
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-00000002.ckpt", "step-00000004.ckpt"]
    return run_dir


def _truncate(path):
    os.truncate(path, path.stat().st_size // 2)


def _truncate_without_checksum(path):
    """A cut-short copy without its `.sha256`: the safe load sees it."""
    _truncate(path)
    (path.parent / f"{path.name}.sha256").unlink()


def _flip_bytes(path):
    """Same size, same zip structure, different tensor bytes: only the checksum sees it."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(255 - b for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


def _train_steps(run_dir):
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        return [int(r["step"]) for r in csv.DictReader(handle) if r["train/loss"]]


def _losses(run_dir):
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        return [float(r["train/loss"]) for r in csv.DictReader(handle) if r["train/loss"]]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [(_truncate, "sha256"), (_truncate_without_checksum, "truncated or corrupted"), (_flip_bytes, "sha256")],
    ids=["truncated", "truncated-no-checksum", "flipped"],
)
def test_resume_auto_skips_a_damaged_newest_checkpoint(finished, tmp_path, caplog, damage, reason):
    newest = finished / "checkpoints" / "step-00000004.ckpt"
    damage(newest)
    with caplog.at_level(logging.INFO):
        summary = run(compose_train([*RUN, "resume=auto"], tmp_path / "v" / "b"))
    skipped = [r.getMessage() for r in caplog.records if ": skipped " in r.getMessage()]
    assert len(skipped) == 1 and str(newest) in skipped[0] and reason in skipped[0]
    assert any("resuming from" in r.getMessage() and "step-00000002.ckpt" in r.getMessage() for r in caplog.records)
    assert summary["steps"] == 4 and _train_steps(tmp_path / "v" / "b") == [3, 4]  # continued from step 2


def test_an_explicit_damaged_checkpoint_is_refused_naming_it(finished, tmp_path):
    newest = finished / "checkpoints" / "step-00000004.ckpt"
    _flip_bytes(newest)
    with pytest.raises(CheckpointError, match=f"{newest} does not match the sha256 in step-00000004.ckpt.sha256"):
        run(compose_train([*RUN, f"resume={newest}"], tmp_path / "v" / "b"))


def test_verification_reads_checksums_when_present(finished):
    older, newest = list_checkpoints(finished)
    verify_checkpoint(newest)
    _flip_bytes(newest)
    (newest.parent / f"{newest.name}.sha256").unlink()  # copied without its checksum: checked by loading only
    verify_checkpoint(newest)
    _truncate(older)
    (older.parent / f"{older.name}.sha256").unlink()
    assert newest_valid([finished]) == (newest, [])
    _truncate(newest)
    latest, skipped = newest_valid([finished])
    assert latest is None and len(skipped) == 2 and all("truncated or corrupted" in s for s in skipped)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (["train.max_tokens=384"], ["train.max_tokens 256 -> 384"]),
        (["train.global_batch_tokens=128"], ["train.global_batch_tokens 64 -> 128"]),
        (["optim.lr=0.002", "scheduler.warmup=0.5"], ["optim.lr 0.001 -> 0.002", "scheduler.warmup 0.02 -> 0.5"]),
        (["data.seed=7"], ["data.seed 1234 -> 7"]),
    ],
    ids=["budget", "global-batch", "schedule", "data-order"],
)
def test_a_resume_refuses_changed_schedule_or_data_settings(finished, tmp_path, changes, named):
    with pytest.raises(ValueError, match="resume_allow_changes=true") as info:
        run(compose_train([*RUN, "resume=auto", *changes], tmp_path / "v" / "b"))
    message = str(info.value)
    assert all(n in message for n in named) and "\n" not in message, message
    assert not (tmp_path / "v" / "b" / "checkpoints").exists()  # refused before any training


def test_resume_allow_changes_accepts_them(finished, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        summary = run(compose_train([*RUN, "resume=auto", "train.max_tokens=384", "resume_allow_changes=true"],
                                    tmp_path / "v" / "b"))  # fmt: skip
    assert summary["steps"] == 6 and _train_steps(tmp_path / "v" / "b") == [5, 6]
    assert any("changed settings: train.max_tokens 256 -> 384" in r.getMessage() for r in caplog.records)


def test_a_resume_may_switch_between_fused_and_foreach_adamw(finished, tmp_path):
    """`optim.fused` says how AdamW runs, not what it computes: a resume may change it, and Adam's state carries over
    (the steps after the switch match the fused run's own, where a fresh optimiser state would not)."""
    step_2 = finished / "checkpoints" / "step-00000002.ckpt"
    run(compose_train([*RUN, f"resume={step_2}", "optim.fused=false"], tmp_path / "v" / "b"))
    assert _train_steps(tmp_path / "v" / "b") == [3, 4]
    fused, foreach = (_losses(finished)[2:], _losses(tmp_path / "v" / "b"))
    assert foreach == pytest.approx(fused, rel=1e-5)


def test_a_resume_that_builds_another_model_is_refused_naming_the_setting(finished):
    """A checkpoint's state would not load into another model: refused in one line naming what differs (before, a
    40-line state_dict error), whatever resume_allow_changes says."""
    for allow in ("false", "true"):
        cfg = compose_train([*RUN, "model.d_model=48", f"resume={finished}", f"resume_allow_changes={allow}"],
                            finished.parent / "b")  # fmt: skip
        with pytest.raises(ConfigError, match=r"another model than this config builds \(model.d_model 32 -> 48\)"):
            run(cfg)


def test_a_refused_model_names_the_presets_size_where_the_config_leaves_it_null(tmp_path):
    """A preset's size is null in the stored config: the refusal once read `model.d_model None -> 48`."""
    from klalm.train.resume import check_model

    saved = {"arch": "kla", "preset": "tiny", "d_model": None, "n_layers": None}
    checkpoint = {"state_dict": {"w": torch.empty(64)}, "klalm": {"model_config": saved}}
    with pytest.raises(ConfigError, match=r"\(model.d_model 64 -> 48\)"):
        check_model(tmp_path / "x.ckpt", checkpoint, {**saved, "d_model": 48}, {"w": (48,)})


def test_a_refused_model_the_stored_config_does_not_explain_names_the_first_weights():
    """When the stored model config equals the run's, the refusal names the first tensors that do not fit (one of
    each kind), not only how many there are."""
    model_config = {"d_model": 32}
    saved = {"_orig_mod.model.w": torch.zeros(4, 8), "model.old": torch.zeros(1), "model.b": torch.zeros(8)}
    checkpoint = {"state_dict": saved, "klalm": {"model_config": model_config}}
    shapes = {"model.w": (8, 8), "model.new": (2,), "model.b": (8,)}
    with pytest.raises(ConfigError) as info:
        check_model(Path("step-2.ckpt"), checkpoint, model_config, shapes)
    message = str(info.value)
    assert "(1 missing (e.g. model.new); 1 unexpected (e.g. model.old); " in message, message
    assert "; 1 of another shape (e.g. model.w (4, 8) for (8, 8)));" in message, message


def test_a_refused_resume_removes_its_own_config_record_and_says_why_in_the_log(finished):
    """`klalm-train resume=<run dir>` refused (here: a changed learning rate): the run's folder keeps everything it
    had, loses the `.hydra/resume-*` record this start wrote, and its train.log says why the start stopped."""
    import subprocess
    import sys

    from .conftest import RUN_ENV

    def kept():  # what the run wrote (a start's lock, log and config records aside)
        startup = {"train.log", ".klalm.lock", ".hydra"}
        return sorted(p.relative_to(finished) for p in finished.rglob("*") if p.relative_to(finished).parts[0]
                      not in startup)  # fmt: skip

    before = kept()
    cmd = [sys.executable, "-m", "klalm.train", *RUN, f"resume={finished}", "optim.lr=0.5"]
    proc = subprocess.run(cmd, env=RUN_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("klalm-train: resume from")
    assert kept() == before and not list(finished.glob(".hydra/resume-*"))
    log = (finished / "train.log").read_text()
    assert "stopped: resume from" in log and "Traceback" in log  # the traceback goes to the log, not the console


def test_a_resume_whose_tokenizer_was_retrained_on_edited_files_is_refused(tmp_path):
    """A trained BPE's cache follows its files: after an edit the config builds another tokenizer than the run's."""
    from klalm.data.tokenizer import train_bpe_tokenizer

    run = tmp_path / "run"
    texts = ["the cat sat on the mat"] * 20
    saved = train_bpe_tokenizer(texts, 300, run / "tokenizer")
    ckpt = run / "checkpoints" / "step-00000004.ckpt"
    check_tokenizer(ckpt, saved)  # the same: resumes
    check_tokenizer(tmp_path / "elsewhere" / "checkpoints" / "step-00000004.ckpt", saved)  # no saved one: unchecked
    edited = train_bpe_tokenizer(["a quick brown fox jumps over"] * 20, 300, tmp_path / "edited")
    with pytest.raises(ConfigError, match="another vocabulary than the run's own"):
        check_tokenizer(ckpt, edited)
