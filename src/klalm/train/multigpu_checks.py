"""Multi-GPU run checks: a per-rank token audit, per-rank data-loader states in checkpoints, and an early stop.

Used by `scripts/multigpu_check.sh` (the 2-GPU acceptance run) and usable in any run:

    klalm-train ... data._target_=klalm.train.multigpu_checks.TokenAuditDataModule +data.audit_dir=<dir>
    klalm-train ... +callbacks.rank_loader_states._target_=klalm.train.multigpu_checks.RankLoaderStates
    klalm-train ... +callbacks.stop._target_=klalm.train.multigpu_checks.StopAfterSteps +callbacks.stop.steps=50

- `TokenAuditDataModule` appends one line `<step>\t<hash>` per training window to `<audit_dir>/rank<r>.tsv`, where
  a window is the T + 1 tokens of one example (input_ids followed by the last label) and the hash is an 8-byte
  BLAKE2b of its int64 ids. `scripts/multigpu_check.py` reads these files to show that no window is read by two
  ranks and that two runs read the same windows at the same optimiser step.
- `RankLoaderStates` fixes what a plain Lightning checkpoint lacks under data parallelism: only rank 0 writes the
  checkpoint, so it holds only rank 0's loader position, and every rank of a resumed run would restore that one
  (shard datasets refuse it; other datasets would silently re-read rank 0's data on every rank). The callback
  gathers every rank's loader state into the checkpoint and, on resume, gives each rank its own. When the world
  size changes (2 GPUs → 1 GPU), token-shard positions are re-split exactly (`reshard_loader_states`).
- `StopAfterSteps` ends training after a given optimiser step while the lr schedule keeps the full run's length,
  so a short window of a long recipe can be compared across launch modes.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from klalm.data.datamodule import TextDataModule
from klalm.train.distributed import gather_objects

log = logging.getLogger(__name__)

AUDIT_FILE = "rank{rank}.tsv"  # one per global rank, in TokenAuditDataModule's audit_dir
STATE_KEY = "klalm_rank_loader_states"  # checkpoint entry written by RankLoaderStates
SHARD_STATE_KEYS = frozenset({"consumer", "epoch", "pos", "batches"})  # klalm.data.shards.ShardDataset state


def window_hash(window: np.ndarray) -> str:
    """Hex BLAKE2b-64 digest of one token window (ids as little-endian int64), e.g. "9f86d081884c7d65"."""
    return hashlib.blake2b(np.ascontiguousarray(window, dtype="<i8").tobytes(), digest_size=8).hexdigest()


def batch_window_hashes(batch: dict[str, torch.Tensor]) -> list[str]:
    """Hashes of the B windows of a batch: window b = input_ids[b] followed by labels[b, -1] (T + 1 tokens).

    Args:
        batch: {"input_ids": [B, T], "labels": [B, T]} integer tensors (labels = inputs shifted by one).
    """
    for key in ("input_ids", "labels"):
        if key not in batch:
            raise KeyError(f"batch lacks {key!r} (keys: {sorted(batch)})")
    ids = batch["input_ids"].detach().cpu().numpy()  # [B, T]
    last = batch["labels"][:, -1:].detach().cpu().numpy()  # [B, 1]
    windows = np.concatenate([ids, last], axis=1)  # [B, T+1]
    return [window_hash(w) for w in windows]


class TokenAuditDataModule(TextDataModule):
    """`TextDataModule` that records a hash of every training window a rank consumes (see module docstring).

    Args:
        audit_dir: folder of the per-rank files `rank<r>.tsv` (created; lines are appended).
        **kwargs: every `TextDataModule` argument.
    """

    def __init__(self, audit_dir: str | Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.audit_dir = Path(audit_dir)
        self._audit_handle = None

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Appends `<step>\\t<hash>` for each window of a training batch (hashed on the CPU), then copies it.

        This hook runs for every micro-batch that reaches a training step (`LMModule` moves its batches itself).
        """
        trainer = self.trainer
        if trainer is not None and trainer.training:
            if self._audit_handle is None:
                self.audit_dir.mkdir(parents=True, exist_ok=True)
                path = self.audit_dir / AUDIT_FILE.format(rank=trainer.global_rank)
                self._audit_handle = open(path, "a", encoding="ascii")  # noqa: SIM115 (closed in teardown)
            step = trainer.global_step  # optimiser steps completed: the index of the step this batch feeds
            self._audit_handle.write("".join(f"{step}\t{h}\n" for h in batch_window_hashes(batch)))
            self._audit_handle.flush()
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def teardown(self, stage: str) -> None:
        if self._audit_handle is not None:
            self._audit_handle.close()
            self._audit_handle = None


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
        raise ValueError(
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


class StopAfterSteps(Callback):
    """Stops training after optimiser step `steps` (the schedule still spans the configured token budget).

    Args:
        steps: optimiser steps to run (≥ 1); a resumed run counts from step 0 of the original run.
    """

    def __init__(self, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"callbacks.stop.steps={steps} must be ≥ 1")
        self.steps = steps

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True
