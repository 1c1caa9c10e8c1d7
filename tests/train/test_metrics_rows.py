"""The rows of a run's metrics file: each step's row pairs its loss with the learning rate that step used, and a
run resumed from any of its checkpoints (a finished run's too, or one killed right after a save) ends with exactly the
rows of a run that was never interrupted: no row lost, none twice."""

import csv
import signal
import subprocess
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from klalm.models.checkpoint import checkpoint_step, checksum_path, file_sha256, find_latest, list_checkpoints
from klalm.train.app import run
from klalm.train.checkpoint import RollingCheckpoint
from klalm.train.optim import cosine_multiplier, warmup_steps_of

from .conftest import RUN_ENV, TINY, compose_train, run_train, train_cmd
from .test_checkpoint import FakeTrainer

WITH_CKPT = ["callbacks=default", "callbacks.sampler=null", "callbacks.progress=null"]
# the columns that say what a run computed (perf/* measure how fast it ran)
COMPUTED = ("step", "train/loss", "train/lr", "train/grad_norm", "train/tokens_seen", "val/loss", "val/ppl")


def _rows(run_dir) -> list[tuple[str, ...]]:
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        return [tuple(row.get(key, "") for key in COMPUTED) for row in csv.DictReader(handle)]


def _val_steps(run_dir) -> list[int]:
    return [int(row[0]) for row in _rows(run_dir) if row[COMPUTED.index("val/loss")]]


def test_the_logged_lr_is_the_one_its_step_used(tmp_path):
    """The lr of step k's row is the lr the optimiser applied in step k: the schedule's value at (0-based) step
    k - 1. It was the next step's, read after the scheduler had stepped."""
    cfg = compose_train([*TINY, "train.max_tokens=384", "scheduler.warmup=2"], tmp_path / "run")  # 6 steps
    applied = []
    hook = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: applied.append(optimizer.param_groups[0]["lr"])
    )
    try:
        summary = run(cfg)
    finally:
        hook.remove()
    steps = summary["steps"]
    schedule = {"warmup_steps": warmup_steps_of(cfg.scheduler.warmup, steps), "total_steps": steps,
                "min_lr_ratio": cfg.scheduler.min_lr_ratio}  # fmt: skip
    expected = [cfg.optim.lr * cosine_multiplier(k - 1, **schedule) for k in range(1, steps + 1)]
    logged = {int(row[0]): float(row[2]) for row in _rows(tmp_path / "run") if row[2]}
    assert sorted(logged) == list(range(1, steps + 1))
    assert applied == [logged[k] for k in sorted(logged)]
    assert [logged[k] for k in sorted(logged)] == expected


def _finish_and_resume(run_dir, val_every: int) -> tuple[list, list, dict, dict]:
    """Trains TINY's 4 steps (validating every `val_every`, checkpoints every 2, a final validation), then resumes the
    finished run: (its overrides, its metrics rows, its summary, the resumed run's summary)."""
    overrides = [*TINY, *WITH_CKPT, f"train.val_every_n_steps={val_every}", "callbacks.checkpoint.every_n_steps=2",
                 "train.final_eval=true"]  # fmt: skip
    first = run(compose_train(overrides, run_dir))
    rows = _rows(run_dir)
    again = run(compose_train([*overrides, f"resume={run_dir}"], run_dir))
    assert _rows(run_dir) == rows
    assert (again["val_loss"], again["val_ppl"]) == (first["val_loss"], first["val_ppl"])
    return overrides, rows, first, again


def test_a_resumed_finished_run_adds_no_row(tmp_path):
    """A finished run's checkpoint says its last step was validated: resuming it (it trains nothing) writes no second
    validation row and keeps the validation values of its summary. A checkpoint written before it said so still
    resumes, and validates its last step again, in place of the row of that step's first validation."""
    run_dir = tmp_path / "run"
    overrides, rows, first, _ = _finish_and_resume(run_dir, val_every=2)
    assert _val_steps(run_dir) == [2, 4]

    ckpt = find_latest([run_dir])
    saved = torch.load(ckpt, weights_only=True)
    del saved["klalm"]["last_val"], saved["klalm"]["last_val_step"]
    torch.save(saved, ckpt)
    checksum_path(ckpt).write_text(f"{file_sha256(ckpt)}  {ckpt.name}\n")
    old = run(compose_train([*overrides, f"resume={run_dir}"], run_dir))
    assert _rows(run_dir) == rows
    assert old["val_loss"] == first["val_loss"]


def test_a_resumed_finished_run_whose_last_step_does_not_validate_adds_no_row(tmp_path):
    """The final validation of a run whose last step is no validation step comes after its last checkpoint, which
    so does not cover it: resuming the finished run validated that step again and added its row a second time."""
    _finish_and_resume(tmp_path / "run", val_every=3)
    assert _val_steps(tmp_path / "run") == [3, 4]


# Runs `python -m klalm.train <args>` whose process ends (like a SIGKILL: nothing flushed, no teardown) right after
# the checkpoint of step argv[1] is written.
KILL_AFTER_SAVE = """
import os, sys
from klalm.cli import train
from klalm.train.checkpoint import RollingCheckpoint

step, sys.argv = int(sys.argv[1]), ["klalm-train", *sys.argv[2:]]
save = RollingCheckpoint.save

def save_then_die(self, trainer):
    path = save(self, trainer)
    if trainer.global_step == step:
        os._exit(137)
    return path

RollingCheckpoint.save = save_then_die
train()
"""


def test_a_run_killed_right_after_a_checkpoint_resumes_to_the_uninterrupted_rows(tmp_path):
    """Killed the moment its checkpoint of a validating step is on disk, then resumed from it, a run ends with the
    rows of a run never killed, that step's validation row included (the save used to come before the validation,
    whose row a resumed run never writes), and nothing twice."""
    overrides = [*TINY, *WITH_CKPT, "train.max_tokens=512", "train.val_every_n_steps=4",
                 "callbacks.checkpoint.every_n_steps=4", "train.final_eval=true"]  # fmt: skip
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    run_train(overrides, reference)
    cmd = [sys.executable, "-c", KILL_AFTER_SAVE, "4", *train_cmd(overrides, killed)[3:]]
    proc = subprocess.run(cmd, env=RUN_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 137, proc.stderr[-4000:]
    assert find_latest([killed]).name == "step-00000004.ckpt"
    run_train([*overrides, f"resume={killed}"], killed)
    assert _val_steps(reference) == [4, 8]
    assert _rows(killed) == _rows(reference)


def _saved_steps(run_dir) -> list[int]:
    return [checkpoint_step(path) for path in list_checkpoints(run_dir)]


def test_a_step_that_validates_is_saved_after_its_validation(tmp_path):
    """A periodic save at a step that Lightning validates after waits for that validation's end (whose row the save
    flushes); a step without validation, or a stop, is saved at its end, as before."""
    callback = RollingCheckpoint(tmp_path / "checkpoints", every_n_steps=4, keep_last=10)
    callback.on_train_batch_end(FakeTrainer(4, validates=True))
    assert _saved_steps(tmp_path) == []
    callback.on_validation_end(FakeTrainer(4), None)
    assert _saved_steps(tmp_path) == [4]
    callback.on_validation_end(FakeTrainer(4), None)  # the end of training's evaluation, say: nothing due
    callback.on_train_batch_end(FakeTrainer(8))
    assert _saved_steps(tmp_path) == [4, 8]
    callback.stop_signal = signal.SIGTERM
    trainer = FakeTrainer(9, validates=True)
    callback.on_train_batch_end(trainer)  # a stop does not wait for the validation
    assert _saved_steps(tmp_path) == [4, 8, 9] and trainer._signal_connector.received_sigterm
    callback.stop_signal = None
    callback.on_train_batch_end(FakeTrainer(12, validates=True))
    assert _saved_steps(tmp_path) == [4, 8, 9]  # waits for step 12's validation, which never ends (say)
    callback.on_train_batch_end(FakeTrainer(13))
    assert _saved_steps(tmp_path) == [4, 8, 9, 13]  # so the next step saves


def test_a_stop_at_a_step_that_validates_saves_at_once_and_stops(tmp_path, monkeypatch):
    """SIGTERM during a step that Lightning validates after: the stop's checkpoint does not wait for the validation
    (a first one may compile for minutes), the run stops after the step (exit 143), and that step's validation row is
    the one thing lost."""
    import os

    import pytest

    from klalm.train.module import LMModule

    step = LMModule.training_step

    def stop_in_step_4(self, dataloader_iter):
        if self.global_step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # recorded by RollingCheckpoint's handler, read at the step's end
        return step(self, dataloader_iter)

    monkeypatch.setattr(LMModule, "training_step", stop_in_step_4)
    overrides = [*TINY, *WITH_CKPT, "train.max_tokens=512", "train.val_every_n_steps=4", "data.val_batches=3",
                 "callbacks.checkpoint.every_n_steps=0"]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        run(compose_train(overrides, tmp_path / "run"))
    assert stopped.value.code == 143
    assert _saved_steps(tmp_path / "run") == [4] and _val_steps(tmp_path / "run") == []
