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

`RankLoaderStates` (on by default: `callbacks.rank_loader_states`) fixes what a plain Lightning checkpoint lacks
under data parallelism: only rank 0 writes the checkpoint, so it holds only rank 0's loader position, and every rank
of a resumed run would restore that one (shard datasets refuse it; other datasets would silently re-read rank 0's
data on every rank). The callback gathers every rank's loader state into the checkpoint and, on resume, gives each
rank its own. When the world size changes (2 GPUs -> 1 GPU), token-shard positions are re-split exactly
(`reshard_loader_states`).
"""

from __future__ import annotations

import copy
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

from klalm.data.loader import LoaderStateError
from klalm.models.checkpoint import (
    CHECKSUM_SUFFIX,
    CKPT_DIR,
    checksum_path,
    file_sha256,
    list_checkpoints,
    model_state_from_checkpoint,
)
from klalm.train.distributed import HostFlag, gather_objects

log = logging.getLogger(__name__)

STATE_KEY = "klalm_rank_loader_states"  # checkpoint entry written by RankLoaderStates
SHARD_STATE_KEYS = frozenset({"consumer", "epoch", "pos", "batches"})  # klalm.data.shards.ShardDataset state


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


STOP_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}  # what saves and stops a run, and its name


class RollingCheckpoint(Callback):
    """Saves every `every_n_steps` optimiser steps, at the end of training and on a stop signal; keeps the last k.

    A stop signal is SIGTERM (a scheduler's preemption) or the first Ctrl-C (SIGINT): the run saves a checkpoint at
    the end of the step it is in and stops (`stop_signal` says which; the app exits 143 or 130). A second Ctrl-C
    stops at once, without saving, as Ctrl-C does elsewhere.

    Args:
        dirpath: folder of the checkpoint files (`<run_dir>/checkpoints`).
        every_n_steps: save period in optimiser steps; 0 saves only at the end and on a stop signal.
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
        self.stop_signal: int | None = None  # the stop signal this rank got (set by the handler `on_train_start` sets)
        self._stop_sum: HostFlag | None = None  # the ranks' stop flags summed, started a step ago
        self._previous_sigint: Any = None  # SIGINT's handler before training, put back at teardown
        self._ctrl_c = 0  # Ctrl-Cs received: the second stops at once
        self._due: tuple[int, bool] | None = None  # (step, stop) of a save waiting for that step's validation
        self.last_path: Path | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Replaces Lightning's SIGTERM handler, and Python's SIGINT one, by one that only records the signal.

        Lightning 2.6's handler runs a `dist.broadcast` inside the signal handler, which interleaves with whatever
        collective the ranks are in (measured: 2-rank CPU DDP runs hung or died without a checkpoint). Here the ranks
        agree at a step boundary instead (`on_train_batch_end`); Lightning restores its handlers at teardown, and
        `teardown` restores SIGINT's. The signal is kept in `stop_signal`, not in Lightning's `received_sigterm`,
        which would end the loop at this step's end, before the ranks have agreed to save.
        """

        def record_stop(signum: int, frame: Any) -> None:
            if signum == signal.SIGINT:
                self._ctrl_c += 1
                if self._ctrl_c > 1:
                    raise KeyboardInterrupt  # a second Ctrl-C (whatever came first): stop at once, unsaved
            if signum == signal.SIGTERM and self.stop_signal is None and trainer.strategy.launcher is not None:
                # forward to the processes Lightning started, as it does; not a Ctrl-C, which a terminal sends to
                # them itself (forwarded, it would be their second: stop at once, unsaved, while rank 0 saves)
                trainer.strategy.launcher.kill(signum)
            if signum == signal.SIGINT:
                log.warning("Ctrl-C: saving a checkpoint after this step, then stopping (Ctrl-C again: now, unsaved)")
            self.stop_signal = self.stop_signal or signum

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, record_stop)
            self._previous_sigint = signal.signal(signal.SIGINT, record_stop)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)  # Ctrl-C interrupts evaluation and export again
            self._previous_sigint = None

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        """Saves at a periodic step, or where Lightning validates after this step once it has (`on_validation_end`);
        a stop saves at once.

        A periodic checkpoint of a step follows the step's validation: a run resumed from it skips that validation
        (its loops' state says the step is done), so a validation row the checkpoint did not cover would be lost for
        good. Saved after it, the checkpoint is the one Lightning's own `ModelCheckpoint` writes `on_validation_end`,
        which Lightning resumes after the validation. A stop does not wait for a validation (a first one may compile
        for minutes, past a scheduler's grace period): its step's validation row, if that step validates, is lost. A
        save still waiting at the next step (a validation that never ended) is made there.
        """
        step = trainer.global_step
        periodic = self.every_n_steps > 0 and step % self.every_n_steps == 0
        stop = self._any_rank_got_stop_signal(trainer)
        waited = self._due is not None  # for a validation after an earlier step that did not end
        if (periodic or stop or waited) and step != self.last_saved_step:
            self._due = (step, stop)
            if stop or not _validates_after_this_step(trainer):
                self._save_due(trainer)
        elif stop:  # this step is saved already
            trainer._signal_connector.received_sigterm = True  # so that every rank leaves the loop after this step

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._due is not None and self._due[0] == trainer.global_step:
            self._save_due(trainer)

    def _save_due(self, trainer: pl.Trainer) -> None:
        """Writes the checkpoint `on_train_batch_end` decided on, and says so where it is a stop's."""
        _, stop = self._due
        path = self.save(trainer)
        if stop:
            trainer._signal_connector.received_sigterm = True  # so that every rank leaves the loop after this step
            name = STOP_SIGNALS.get(self.stop_signal, "a stop signal on another rank")
            # resume=auto finds it only where the run folder is a default one (not one set by hydra.run.dir)
            run = path.parent.parent if path.parent.name == "checkpoints" else "<the run folder>"
            log.warning("%s received: wrote %s; stopping (resume with resume=%s)", name, path, run)

    def _any_rank_got_stop_signal(self, trainer: pl.Trainer) -> bool:
        """Whether to stop, the same answer on every rank (a save is collective). One process: its own flag. Several:
        each step starts a sum of the ranks' flags and reads the one started a step before (`HostFlag`), so the
        step never waits for the GPU (Lightning's `reduce_boolean_decision` reads its sum at once, which waits for
        all the work queued on the GPU); the ranks stop one step after the signal."""
        if trainer.world_size == 1:
            return self.stop_signal is not None
        flag = torch.full((), float(self.stop_signal is not None), device=trainer.strategy.root_device)
        started, self._stop_sum = self._stop_sum, HostFlag(trainer.strategy.reduce(flag, reduce_op="sum"))
        return started is not None and started.value()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step != self.last_saved_step:
            self.save(trainer)

    def save(self, trainer: pl.Trainer) -> Path:
        """Writes `step-<N>.ckpt` atomically (temporary name, then rename) and prunes old checkpoints.

        The loggers are flushed first, so a kill after the save loses no metrics row of a step the checkpoint
        covers: the app runs this callback after `StepMetrics`, which logs the step's row, and a periodic save of a
        step that validates comes after its validation row (`on_train_batch_end`).
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
        self.last_saved_step, self.last_path, self._due = step, final, None
        return final

    def state_dict(self) -> dict[str, Any]:
        return {"last_saved_step": self.last_saved_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_saved_step = state_dict["last_saved_step"]


def _validates_after_this_step(trainer: pl.Trainer) -> bool:
    """Whether Lightning's fit loop validates right after the step whose `on_train_batch_end` runs now: the loop's own
    test (a private method of Lightning >= 2.6, the version pyproject.toml requires), which it makes once the step's
    hooks have run. The hooks after this one change nothing it reads (the batch count, the last-batch flag,
    `should_stop`: `StopAfterSteps` sets that, and runs before this callback; a time-based `val_check_interval` is
    not klalm's)."""
    return trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher)


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
    """Writes the trained model (and tokenizer) as a self-contained export (`klalm.models.export.save_export`) that
    records the step it was made at; every rank must call it. `max_length`: the trained context length.

    The full state dict is gathered through the strategy (so sharded FSDP runs export too) and rank 0 writes it.
    """
    from klalm.models.export import save_export

    state = trainer.strategy.lightning_module_state_dict()
    if not trainer.is_global_zero:
        return None
    weights = model_state_from_checkpoint({"state_dict": state})
    model = trainer.lightning_module.model
    save_export(model, out_dir, tokenizer, max_length=max_length, state_dict=weights, step=trainer.global_step)
    log.info("exported Hugging Face model to %s", out_dir)
    return out_dir


def _dataset_states(loader_state: dict[str, Any]) -> list[dict[str, Any]]:
    """The dataset states inside a `StatefulDataLoader` state, one per worker (references, in worker order)."""
    snapshot = loader_state.get("_snapshot")
    if snapshot is None:  # num_workers=0: the main process holds the dataset
        if "dataset_state" not in loader_state:
            raise KeyError(f"loader state has neither '_snapshot' nor 'dataset_state' (keys: {sorted(loader_state)})")
        return [loader_state["dataset_state"]]
    workers = snapshot["_worker_snapshots"]
    return [workers[name]["dataset_state"] for name in sorted(workers, key=lambda n: int(n.rsplit("_", 1)[1]))]


def reshard_loader_states(states: list[dict[str, Any]], world_size: int, rank: int) -> dict[str, Any]:
    """This rank's loader state when a run saved by `len(states)` ranks resumes on `world_size` ranks.

    Same world size: rank r gets the state rank r saved. Otherwise only token-shard datasets (`ShardDataset`,
    window k of an epoch's order goes to consumer k mod n) can be re-split: if all n saved consumers stand at the
    same position p of the same epoch, the windows read so far are exactly the first n·p of that epoch's order,
    and with n' = world_size × workers consumers each new consumer resumes at n·p / n'.

    Args:
        states: the `StatefulDataLoader` states of saved ranks 0..n-1 (same num_workers on every rank).
        world_size: ranks of the resumed run.
        rank: this rank.

    Returns:
        a loader state for this rank (a copy when re-split).

    Raises:
        ValueError: when the positions cannot be re-split exactly (not shard datasets, ranks not in lock-step, or
            n·p not divisible by n').
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside [0, {world_size})")
    if len(states) == world_size:
        return states[rank]
    saved = [_dataset_states(s) for s in states]
    flat = [d for per_rank in saved for d in per_rank]
    if any(not isinstance(d, dict) or set(d) != SHARD_STATE_KEYS for d in flat):
        raise LoaderStateError(
            f"cannot resume a {len(states)}-rank loader state on {world_size} ranks: only token-shard datasets "
            "(data=shards) can be re-split; resume with the same world size"
        )
    positions = {(d["epoch"], d["pos"], d["batches"]) for d in flat}
    consumers = sorted(d["consumer"][0] for d in flat)
    if len(positions) != 1 or consumers != list(range(len(flat))):
        raise ValueError(f"saved shard consumers are not in lock-step (epoch, pos, batches): {sorted(positions)}")
    (epoch, pos, batches), n = positions.pop(), len(flat)
    workers = len(saved[0])
    n_new = world_size * workers
    if (n * pos) % n_new or (n * batches) % n_new:
        raise ValueError(f"{n} consumers at position {pos} cannot be re-split over {n_new} consumers exactly")
    state = copy.deepcopy(states[0])
    for worker, dataset_state in enumerate(_dataset_states(state)):
        dataset_state.update(
            consumer=[rank * workers + worker, n_new], epoch=epoch, pos=n * pos // n_new, batches=n * batches // n_new
        )
    return state


class RankLoaderStates(Callback):
    """Stores every rank's training-loader state in checkpoints and restores each rank's own on resume.

    The datamodule state must be `{"train_loader": <StatefulDataLoader state>}` (as `TextDataModule` writes it).
    Checkpoints without the entry (written without this callback) are resumed as Lightning does by itself, with one
    warning.
    """

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        datamodule = trainer.datamodule
        if datamodule is None:
            raise ValueError("callbacks.rank_loader_states needs a LightningDataModule (the run has none)")
        state = datamodule.state_dict().get("train_loader")
        checkpoint[STATE_KEY] = {"world_size": trainer.world_size, "train_loader": gather_objects(state)}

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        saved = checkpoint.get(STATE_KEY)
        if saved is None:
            log.warning("checkpoint has no per-rank loader states (%s): every rank restores rank 0's", STATE_KEY)
            return
        states = saved["train_loader"]
        if any(s is None for s in states):
            return  # saved before the training loader existed: nothing to restore
        state = reshard_loader_states(states, trainer.world_size, trainer.global_rank)
        if len(states) != trainer.world_size:
            log.info("loader state of %d ranks re-split over %d ranks", len(states), trainer.world_size)
        # The datamodule was restored (with rank 0's state) before callbacks are: overwrite it, and the copy in
        # the fit loop that Lightning loads into the training loader once it exists.
        trainer.datamodule.load_state_dict({"train_loader": state})
        fit_state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        if "combined_loader" in fit_state:
            fit_state["combined_loader"] = [state]
