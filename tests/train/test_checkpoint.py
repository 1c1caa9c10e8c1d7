"""Rolling checkpoints: atomic writes (a crash mid-save keeps every earlier checkpoint), keep-last-k, discovery."""

import hashlib
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from klalm.models.checkpoint import checkpoint_step, find_latest, list_checkpoints
from klalm.train.checkpoint import RollingCheckpoint


class FakeStrategy:
    def barrier(self, name=None):
        pass

    root_device = torch.device("cpu")

    def reduce(self, tensor, reduce_op):  # the sum over ranks of a world of three, each with this rank's flag
        return tensor * 3


class FakeTrainer(SimpleNamespace):
    """What RollingCheckpoint uses of a Trainer; save_checkpoint writes a payload (or fails half-way)."""

    def __init__(self, step, fail=False, world_size=1, validates=False):
        connector = SimpleNamespace(received_sigterm=False)
        epoch_loop = SimpleNamespace(_should_check_val_fx=lambda data_fetcher: validates)  # after this step?
        super().__init__(
            global_step=step,
            is_global_zero=True,
            strategy=FakeStrategy(),
            _signal_connector=connector,
            loggers=[],
            world_size=world_size,
            fit_loop=SimpleNamespace(epoch_loop=epoch_loop, _data_fetcher=None),
        )
        self.fail = fail

    def save_checkpoint(self, path, weights_only=None):
        if self.fail:
            Path(path).write_bytes(b"partial")
            raise OSError("disk full")
        torch.save({"step": self.global_step, "state_dict": {}, "klalm": {}}, path)  # what verification looks for


def _step_in(path):
    return torch.load(path, weights_only=True)["step"]


def test_saves_keep_the_last_k_under_final_names(tmp_path):
    callback = RollingCheckpoint(tmp_path / "checkpoints", every_n_steps=10, keep_last=2)
    for step in (10, 20, 30):
        callback.save(FakeTrainer(step))
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step-00000020.ckpt", "step-00000030.ckpt"]
    assert _step_in(tmp_path / "checkpoints" / "step-00000030.ckpt") == 30
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    # each kept checkpoint has its sha256 beside it (`sha256sum -c` format); the pruned ones' went with them
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.sha256")) == [f"{n}.sha256" for n in names]
    digest = hashlib.sha256((tmp_path / "checkpoints" / names[1]).read_bytes()).hexdigest()
    assert (tmp_path / "checkpoints" / f"{names[1]}.sha256").read_text() == f"{digest}  {names[1]}\n"


def test_crash_during_save_leaves_previous_checkpoints_intact(tmp_path):
    callback = RollingCheckpoint(tmp_path / "checkpoints", every_n_steps=10, keep_last=1)
    callback.save(FakeTrainer(10))
    with pytest.raises(OSError, match="disk full"):
        callback.save(FakeTrainer(20, fail=True))
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000010.ckpt"]
    assert _step_in(find_latest([tmp_path])) == 10  # the half-written file never got a final name
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step-00000010.ckpt", "step-00000010.ckpt.sha256"]
    callback.save(FakeTrainer(30))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step-00000030.ckpt", "step-00000030.ckpt.sha256"]


@pytest.mark.parametrize("world_size", [1, 3])
def test_periodic_and_sigterm_triggers(tmp_path, world_size):
    """One process stops at the step it got SIGTERM; several agree on the sum of their flags started a step before,
    so they stop one step later (no step waits for the GPU to read the sum)."""
    callback = RollingCheckpoint(tmp_path / "checkpoints", every_n_steps=4, keep_last=10)
    for step in range(1, 10):
        callback.on_train_batch_end(FakeTrainer(step, world_size=world_size))
    assert [checkpoint_step(p) for p in list_checkpoints(tmp_path)] == [4, 8]
    trainer = FakeTrainer(9, world_size=world_size)
    callback.stop_signal = signal.SIGTERM  # what the SIGTERM handler does
    callback.on_train_batch_end(trainer)
    if world_size > 1:
        assert checkpoint_step(find_latest([tmp_path])) == 8
        trainer.global_step = 10
        callback.on_train_batch_end(trainer)
    assert checkpoint_step(find_latest([tmp_path])) == (9 if world_size == 1 else 10)
    assert trainer._signal_connector.received_sigterm  # so that Lightning ends the loop after this step


def test_find_latest_takes_the_run_that_wrote_last_then_its_highest_step(tmp_path):
    for run, steps in {"a": [5, 10], "b": [7, 3]}.items():
        folder = tmp_path / run / "checkpoints"
        folder.mkdir(parents=True)
        for i, step in enumerate(steps):
            (path := folder / f"step-{step:08d}.ckpt").write_bytes(b"x")
            written = time.time() - (100 if run == "a" else 50) + i  # b after a; within b, step 3 written last
            os.utime(path, (written, written))
    assert find_latest([tmp_path / "a", tmp_path / "b"]) == tmp_path / "b" / "checkpoints" / "step-00000007.ckpt"
    assert find_latest([tmp_path / "missing"]) is None


@pytest.mark.parametrize(("kwargs", "key"), [({"every_n_steps": -1}, "every_n_steps"), ({"keep_last": 0}, "keep_last")])
def test_bad_settings_name_the_key(tmp_path, kwargs, key):
    with pytest.raises(ValueError, match=key):
        RollingCheckpoint(tmp_path, **kwargs)


def test_a_checkpoint_the_safe_loader_would_refuse_is_never_published(tmp_path):
    class Unsafe(FakeTrainer):
        def save_checkpoint(self, path, weights_only=None):
            torch.save({"step": self.global_step, "state": Path("not/plain/data")}, path)

    callback = RollingCheckpoint(tmp_path / "checkpoints", every_n_steps=10, keep_last=2)
    with pytest.raises(TypeError, match="safe loader would refuse.*PosixPath"):
        callback.save(Unsafe(10))
    assert list_checkpoints(tmp_path) == [] and os.listdir(tmp_path / "checkpoints") == []
