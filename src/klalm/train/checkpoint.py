"""Checkpoints written during training: atomic rolling saves and the final HF export.

Layout of a run directory (`paths.run_dir`; `klalm.models.checkpoint` reads it back):

    checkpoints/step-00000100.ckpt   Lightning checkpoints (model, optimiser, scheduler, data-loader state,
                                     RNG, tokens seen), the last `keep_last` of them
    checkpoints/step-00000100.ckpt.sha256   its sha256, written before the checkpoint gets its name
                                     (`sha256sum -c` format)
    tokenizer/                       the run's tokenizer (HF `save_pretrained` layout)
    hf/                              final export (klalm.models.export): model, tokenizer, model code and
                                     SHA256SUMS; `AutoModelForCausalLM.from_pretrained` after `import klalm`,
                                     or with trust_remote_code=True

A checkpoint is first written to a hidden temporary path in the same folder and then renamed, so a crash during a
save leaves every earlier checkpoint intact and never a half-written file under a final name. `verify_checkpoint`
checks a file against its sha256 and the safe loader before a resume uses it (a zip checkpoint carries no checksum
that torch checks: flipped bytes inside a tensor would load silently).

Checkpoints are read only with `torch.load(..., weights_only=True)` (`load_checkpoint_file`): the safe unpickler
builds tensors and plain Python data and refuses anything else, so a planted `.ckpt` cannot run code. klalm writes
nothing else into them, and `RollingCheckpoint.save` checks that before a file gets its final name.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from klalm.models.checkpoint import (
    CHECKSUM_SUFFIX,
    CKPT_DIR,
    checksum_path,
    file_sha256,
    list_checkpoints,
    model_state_from_checkpoint,
)

log = logging.getLogger(__name__)


def remove_stale_temporaries(run_dir: Path) -> None:
    """Deletes what a save cut short by a kill left in `<run_dir>/checkpoints`: temporary files, and a checksum file
    whose checkpoint never got its name.

    Call this only as the folder's one writer (`klalm.train.rundir.lock_run_dir`): another live run's temporary
    file is its save in progress.
    """
    folder = Path(run_dir) / CKPT_DIR
    orphans = [p for p in folder.glob(f"step-*.ckpt{CHECKSUM_SUFFIX}") if not p.with_suffix("").exists()]
    for stale in sorted([*folder.glob(".step-*.tmp"), *orphans]):
        log.warning("removing %s, left by a checkpoint save that did not finish", stale)
        _remove(stale)


class RollingCheckpoint(Callback):
    """Saves every `every_n_steps` optimiser steps, at the end of training and on SIGTERM; keeps the last k.

    Args:
        dirpath: folder of the checkpoint files (`<run_dir>/checkpoints`).
        every_n_steps: save period in optimiser steps; 0 saves only at the end and on SIGTERM.
        keep_last: number of checkpoints kept (older ones are deleted after a successful save); ≥ 1.
    """

    def __init__(self, dirpath: str | Path, every_n_steps: int = 1000, keep_last: int = 2) -> None:
        if every_n_steps < 0:
            raise ValueError(f"callbacks.checkpoint.every_n_steps={every_n_steps} must be ≥ 0")
        if keep_last < 1:
            raise ValueError(f"callbacks.checkpoint.keep_last={keep_last} must be ≥ 1")
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.keep_last = keep_last
        self.last_saved_step = -1
        self.last_path: Path | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Replaces Lightning's SIGTERM handler by one that only records the signal.

        Lightning 2.6's handler runs a `dist.broadcast` inside the signal handler, which interleaves with whatever
        collective the ranks are in (measured: 2-rank CPU DDP runs hung or died without a checkpoint). Here the ranks
        agree at the next step boundary instead (`on_train_batch_end`); Lightning restores its handlers at teardown.
        """
        connector = trainer._signal_connector

        def record_sigterm(signum: int, frame: Any) -> None:
            if not connector.received_sigterm and trainer.strategy.launcher is not None:
                trainer.strategy.launcher.kill(signum)  # forward to the processes Lightning started, as it does
            connector.received_sigterm = True

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, record_sigterm)

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        step = trainer.global_step
        periodic = self.every_n_steps > 0 and step % self.every_n_steps == 0
        # every rank must take the same decision (a save is collective): stop if any rank got SIGTERM
        sigterm = trainer.strategy.reduce_boolean_decision(bool(trainer.received_sigterm), all=False)
        if sigterm:
            trainer._signal_connector.received_sigterm = True  # so that every rank leaves the loop after this step
        if (periodic or sigterm) and step != self.last_saved_step:
            path = self.save(trainer)
            if sigterm:
                log.warning("SIGTERM received: wrote %s; stopping (resume with resume=auto)", path)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step != self.last_saved_step:
            self.save(trainer)

    def save(self, trainer: pl.Trainer) -> Path:
        """Writes `step-<N>.ckpt` atomically (temporary name, then rename) and prunes old checkpoints.

        The loggers are flushed first, so a kill after the save loses no metrics row of a step the checkpoint
        covers (the app runs this callback after `StepMetrics`, which logs the step's row).
        """
        step = trainer.global_step
        for logger in trainer.loggers:
            logger.save()
        final = self.dirpath / f"step-{step:08d}.ckpt"
        tmp, tmp_checksum = (self.dirpath / f".{p.name}.tmp" for p in (final, checksum_path(final)))
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
        trainer.strategy.barrier("klalm_ckpt_prepare")
        try:
            # weights_only=False: the full training state (optimiser, loops, loader), not only the weights. Every
            # rank takes part (sharded strategies); rank 0 writes.
            trainer.save_checkpoint(tmp, weights_only=False)
            if trainer.is_global_zero:
                _require_safe_contents(tmp)
                _fsync_tree(tmp)
                tmp_checksum.write_text(f"{file_sha256(tmp)}  {final.name}\n")
                _fsync_tree(tmp_checksum)
        except BaseException:
            if trainer.is_global_zero:
                _remove(tmp)  # (a kill leaves them: the next run in this folder removes them)
                _remove(tmp_checksum)
            raise
        if trainer.is_global_zero:
            os.replace(tmp_checksum, checksum_path(final))  # first: every named checkpoint has its checksum
            os.replace(tmp, final)
            _fsync_dir(self.dirpath)
            for old in list_checkpoints(self.dirpath.parent)[: -self.keep_last]:
                _remove(old)
                _remove(checksum_path(old))
        trainer.strategy.barrier("klalm_ckpt_done")
        self.last_saved_step, self.last_path = step, final
        return final

    def state_dict(self) -> dict[str, Any]:
        return {"last_saved_step": self.last_saved_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_saved_step = state_dict["last_saved_step"]


def _require_safe_contents(path: Path) -> None:
    """Refuses to publish a checkpoint that `load_checkpoint_file` would refuse (a klalm bug, caught at the save
    rather than at the resume weeks later); reads only the pickle, not the tensors."""
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    if unsafe:
        raise TypeError(
            f"klalm wrote a checkpoint ({path.name}) that its safe loader would refuse: it holds {', '.join(unsafe)}; "
            "store such state as tensors or plain Python data"
        )


def _remove(path: Path) -> None:
    """Deletes a file or folder; one that is already gone is fine (readers may race with the pruning)."""
    try:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def _fsync_tree(path: Path) -> None:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def export_hf(trainer: pl.Trainer, out_dir: Path, tokenizer: Any, max_length: int | None = None) -> Path | None:
    """Writes the trained model (and tokenizer) as a self-contained export (`klalm.models.export.save_export`);
    every rank must call it. `max_length`: the trained context length.

    The full state dict is gathered through the strategy (so sharded FSDP runs export too) and rank 0 writes it.
    """
    from klalm.models.export import save_export

    state = trainer.strategy.lightning_module_state_dict()
    if not trainer.is_global_zero:
        return None
    weights = model_state_from_checkpoint({"state_dict": state})
    save_export(trainer.lightning_module.model, out_dir, tokenizer, max_length=max_length, state_dict=weights)
    log.info("exported Hugging Face model to %s", out_dir)
    return out_dir
