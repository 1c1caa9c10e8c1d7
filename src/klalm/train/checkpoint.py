"""Checkpoints: atomic rolling saves, `resume=auto` discovery, HF export, and `load_model` for evaluation.

Layout of a run directory (`paths.run_dir`):

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

import hashlib
import logging
import os
import pickle
import re
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)

CKPT_DIR = "checkpoints"
TOKENIZER_DIR = "tokenizer"
HF_DIR = "hf"
CHECKSUM_SUFFIX = ".sha256"
_CKPT_RE = re.compile(r"^step-(\d+)\.ckpt$")


class CheckpointError(ValueError):
    """A checkpoint file that klalm refuses to load: not a klalm checkpoint, unsafe, truncated or corrupted."""


def load_checkpoint_file(path: str | os.PathLike, *, mmap: bool = False) -> dict[str, Any]:
    """Reads a klalm-train checkpoint with the safe unpickler (`weights_only=True`), onto the CPU.

    Args:
        path: a `step-<N>.ckpt` file.
        mmap: map the tensors' storage instead of reading it (cheap checks of a large file).

    Returns:
        The checkpoint dictionary (Lightning's entries plus "klalm").

    Raises:
        CheckpointError: one line naming the file and why: it refers to code the safe unpickler refuses (not a
            trusted klalm checkpoint), it cannot be read (truncated or corrupted), or it lacks klalm's entries.
    """
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path} is not a trusted klalm checkpoint: it refers to {_unsafe_globals(path)}, which the safe loader "
            "(torch.load with weights_only=True) refuses to call; klalm-train writes only tensors and plain data, so "
            "this file came from elsewhere: do not load it with weights_only=False"
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path} cannot be read as a checkpoint (truncated or corrupted?): {reason}") from None
    if not isinstance(checkpoint, dict) or not {"klalm", "state_dict"} <= checkpoint.keys():
        raise CheckpointError(f"{path} is not a klalm-train checkpoint: it lacks the 'klalm' or 'state_dict' entry")
    return checkpoint


def verify_checkpoint(path: Path) -> None:
    """Checks a checkpoint before a resume trusts it: the sha256 written at save time (when its `.sha256` file is
    there: checkpoints copied without it are checked by loading only), then a safe load of its structure (the
    tensors are mapped, not read).

    Raises:
        CheckpointError: one line naming the file and what is wrong with it.
    """
    sidecar = checksum_path(path)
    try:
        if sidecar.is_file() and sidecar.read_text().split()[:1] != [_sha256(path)]:
            raise CheckpointError(f"{path} does not match the sha256 in {sidecar.name}, written when it was saved")
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read: {err}") from None
    load_checkpoint_file(path, mmap=True)


def checksum_path(path: Path) -> Path:
    """The `.sha256` file that belongs to a checkpoint."""
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _unsafe_globals(path: str | os.PathLike) -> str:
    """The Python callables a checkpoint's pickle names beyond the safe set, read without unpickling anything."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (RuntimeError, ValueError, OSError):  # not a zip checkpoint: the names cannot be listed safely
        return "Python objects"
    return ", ".join(names) if names else "Python objects"


def checkpoint_step(path: Path) -> int:
    """The optimiser step encoded in a checkpoint file name `step-XXXXXXXX.ckpt`."""
    match = _CKPT_RE.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not a klalm checkpoint name (expected step-<N>.ckpt)")
    return int(match.group(1))


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints of one run directory, oldest step first (temporary files excluded)."""
    folder = Path(run_dir) / CKPT_DIR
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if _CKPT_RE.match(p.name)), key=checkpoint_step)


def newest_first(run_dirs: list[Path]) -> list[Path]:
    """Checkpoints of several run directories, highest step first (the newer file first on equal steps).

    A file that vanishes while this looks (pruned by the run that writes it) is passed over.
    """
    keyed = []
    for run_dir in run_dirs:
        for path in list_checkpoints(run_dir):
            try:
                keyed.append((checkpoint_step(path), path.stat().st_mtime, path))
            except FileNotFoundError:
                continue
    return [path for *_, path in sorted(keyed, key=lambda key: key[:2], reverse=True)]


def find_latest(run_dirs: list[Path]) -> Path | None:
    """The checkpoint with the highest step over several run directories (newest directory wins ties)."""
    candidates = newest_first(run_dirs)
    return candidates[0] if candidates else None


def newest_valid(run_dirs: list[Path]) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that passes `verify_checkpoint`, and why each newer one was skipped.

    Returns:
        (path or None when none passes, ["<path>: <reason>", ...] for the skipped ones, newest first).
    """
    skipped = []
    for path in newest_first(run_dirs):
        try:
            verify_checkpoint(path)
        except CheckpointError as err:
            skipped.append(str(err))
            continue
        return path, skipped
    return None, skipped


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
                tmp_checksum.write_text(f"{_sha256(tmp)}  {final.name}\n")
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


def model_state_from_checkpoint(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The inner model's state dict from a Lightning checkpoint of `LMModule` (prefix `model.` removed)."""
    from klalm.train.optim import clean_name

    state = checkpoint["state_dict"]
    return {clean_name(k).removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def load_model(path: str | os.PathLike) -> tuple[Any, Any]:
    """Loads a trained model and its tokenizer from a run directory, an HF export or a Lightning `.ckpt`.

    Args:
        path: a run directory (uses its `hf/` export if present, else its newest valid checkpoint), an HF export folder
            (`config.json` inside), or a `step-<N>.ckpt` file written by `klalm-train`.

    Returns:
        (model, tokenizer): a `transformers.PreTrainedModel` in eval mode on the CPU and the run's tokenizer (None for
        runs on synthetic data, which have none).

    Raises:
        FileNotFoundError: naming the path when it holds neither an export nor a checkpoint.
        klalm.models.export.ExportIntegrityError: an export file differs from the export's SHA256SUMS.
    """
    from transformers import AutoModelForCausalLM

    from klalm.models.export import verify_export  # (klalm.models registers the Auto classes)

    path = Path(path)
    if path.is_dir() and (path / HF_DIR / "config.json").is_file():
        path = path / HF_DIR
    if path.is_dir() and (path / "config.json").is_file():
        verify_export(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        return model.eval(), _load_tokenizer(path)
    if path.is_dir():
        latest, skipped = newest_valid([path])
        for reason in skipped:
            log.warning("skipped %s", reason)
        if latest is None:
            reasons = f" (skipped: {'; '.join(skipped)})" if skipped else ""
            raise FileNotFoundError(f"{path} has no {HF_DIR}/ export and no valid {CKPT_DIR}/step-*.ckpt{reasons}")
        path = latest
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return _load_lightning_checkpoint(path)


MODEL_BUILDER = "klalm.models.build_model"  # the one `_target_` a checkpoint's model config may name


def _load_lightning_checkpoint(path: Path) -> tuple[Any, Any]:
    from klalm.models import build_model

    checkpoint = load_checkpoint_file(path)
    meta = checkpoint["klalm"]
    config = dict(meta["model_config"])
    # The config comes from the file: build through klalm's builder only, never through an arbitrary `_target_`.
    if config.get("_target_") != MODEL_BUILDER:
        raise CheckpointError(f"{path}: its model config names {config.get('_target_')!r}, not {MODEL_BUILDER}")
    kwargs = {k: v for k, v in config.items() if not k.startswith("_")}
    model = build_model(**{**kwargs, "vocab_size": meta["vocab_size"]})
    model.load_state_dict(model_state_from_checkpoint(checkpoint))
    tokenizer_dir = path.parent.parent / TOKENIZER_DIR
    return model.eval(), _load_tokenizer(tokenizer_dir)


def _load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    if not (folder / "tokenizer_config.json").is_file():
        return None
    return AutoTokenizer.from_pretrained(folder)


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
