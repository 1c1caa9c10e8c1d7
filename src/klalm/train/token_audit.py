"""A per-rank token audit: which token windows each rank trained on, at which optimiser step.

Used by `scripts/multigpu_check.sh` (the 2-GPU acceptance run) and usable in any run:

    klalm-train ... data._target_=klalm.train.token_audit.TokenAuditDataModule +data.audit_dir=<dir>

`TokenAuditDataModule` appends one line `<step>\t<hash>` per training window to `<audit_dir>/rank<r>.tsv`, where a
window is the T + 1 tokens of one example (input_ids followed by the last label) and the hash is an 8-byte BLAKE2b
of its int64 ids. `scripts/multigpu_check.py` reads these files to show that no window is read by two ranks and
that two runs read the same windows at the same optimiser step.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from klalm.data.datamodule import TextDataModule

AUDIT_FILE = "rank{rank}.tsv"  # one per global rank, in TokenAuditDataModule's audit_dir


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
