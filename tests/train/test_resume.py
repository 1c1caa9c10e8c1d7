"""A run killed mid-way (SIGTERM, Ctrl-C or SIGKILL) and resumed with resume=auto reproduces the uninterrupted run
exactly: the same loss at every step and bit-identical final weights (deterministic mode, CPU)."""

import csv
import signal

import pytest
import torch

from klalm.models.checkpoint import checkpoint_step, find_latest, list_checkpoints

from .conftest import TINY, interrupt_at_checkpoint, run_train, train_cmd

STEPS = 40
OVERRIDES = [
    *TINY,
    f"train.max_tokens={STEPS * 64}",
    "callbacks=default",
    "callbacks.sampler=null",
    "callbacks.progress=null",
    "callbacks.checkpoint.every_n_steps=4",
    "callbacks.checkpoint.keep_last=20",
    "logger.csv.flush_logs_every_n_steps=1",
]


def _losses(run_dir) -> dict[int, str]:
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        return {int(r["step"]): r["train/loss"] for r in csv.DictReader(handle) if r["train/loss"]}


def _weights(ckpt) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ref") / "u" / "a"
    run_train([*OVERRIDES, "run_name=u", f"paths.log_dir={run_dir.parent.parent}"], run_dir)
    return run_dir


def _interrupt(log_dir, sig: signal.Signals, after_step: int, extra: tuple[str, ...] = ()):
    """Starts a run and sends `sig` once its checkpoint of `after_step` exists; returns (run dir, exit code)."""
    run_dir = log_dir / "k" / "a"
    cmd = train_cmd([*OVERRIDES, *extra, "run_name=k", f"paths.log_dir={log_dir}"], run_dir)
    return run_dir, *interrupt_at_checkpoint(cmd, run_dir, after_step, sig)


STOPPED = {signal.SIGTERM: (143, "stopped by SIGTERM"), signal.SIGINT: (130, "stopped by Ctrl-C")}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["sigterm", "ctrl-c", "sigkill"])
def test_killed_and_resumed_run_matches_uninterrupted(tmp_path, uninterrupted, sig):
    killed_dir, code, stderr = _interrupt(tmp_path, sig, after_step=8)
    stopped_at = checkpoint_step(find_latest([killed_dir]))
    if sig in STOPPED:
        assert code == STOPPED[sig][0], stderr[-3000:]
        log = (killed_dir / "train.log").read_text()
        assert STOPPED[sig][1] in log
        assert f"resume with resume={killed_dir}" in log  # the folder: resume=auto misses one set by hydra.run.dir
        assert stopped_at >= 8  # the handler wrote a checkpoint at the step where it stopped
    else:
        assert code == -signal.SIGKILL
    assert stopped_at < STEPS, "the run finished before the signal arrived; nothing was tested"
    # every checkpoint left behind is complete (the atomic write never leaves a truncated final file)
    for ckpt in list_checkpoints(killed_dir):
        _weights(ckpt)

    resumed_dir = tmp_path / "k" / "b"
    run_train([*OVERRIDES, "run_name=k", "resume=auto", f"paths.log_dir={tmp_path}"], resumed_dir)

    reference = _losses(uninterrupted)
    assert sorted(reference) == list(range(1, STEPS + 1))
    before, after = _losses(killed_dir), _losses(resumed_dir)
    assert min(after) == stopped_at + 1  # continued right after the checkpoint
    for step, loss in [*before.items(), *after.items()]:
        assert loss == reference[step], f"step {step}: {loss} != {reference[step]}"
    final, ref_final = _weights(find_latest([resumed_dir])), _weights(find_latest([uninterrupted]))
    assert final.keys() == ref_final.keys()
    for name in final:
        torch.testing.assert_close(final[name], ref_final[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_ctrl_c_with_loader_workers_saves_and_stops(tmp_path):
    """A terminal's Ctrl-C reaches the loader's worker processes too: they ignore it
    (`klalm.data.datamodule.ignore_ctrl_c`), so the training process can finish its step, save and stop instead of
    dying on a dead worker. (The signal goes to the whole process group here, as a terminal sends it.)"""
    run_dir = tmp_path / "run"
    overrides = ["experiment=smoke", "data.num_workers=2", "train.max_tokens=1024000", "callbacks.sampler=null",
                 "callbacks.checkpoint.every_n_steps=4", "train.export_hf=false", "train.plot=false"]  # fmt: skip
    code, stderr = interrupt_at_checkpoint(train_cmd(overrides, run_dir), run_dir, 8, signal.SIGINT, group=True)
    assert code == 130, stderr[-3000:]
    assert "stopped by Ctrl-C" in (run_dir / "train.log").read_text()
    assert 8 <= checkpoint_step(find_latest([run_dir])) < 2000  # saved where it stopped, long before its end
