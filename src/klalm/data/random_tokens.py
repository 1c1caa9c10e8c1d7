"""Random-token data for benchmarks and distributed tests (no dataset, no tokenizer).

Sample i of the stream is a fixed function of (seed, i): `seq_len + 1` uniform token ids, split into inputs and
next-token labels. Rank r of W reads samples r, r + W, r + 2W, ..., so W ranks together read exactly the samples one
process reads, in the same global order, and no sample twice. The loader is a torchdata `StatefulDataLoader`
(`klalm.data.loader.ResumableLoader`), so its position is saved in checkpoints and a resumed run continues from the
next unread sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import IterableDataset

from klalm.data.loader import ResumableLoader, resolve_pin_memory


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class RandomTokens(IterableDataset):
    """An endless, rank-sharded stream of random token windows.

    Args:
        vocab_size: token ids are drawn uniformly from [0, vocab_size).
        seq_len: tokens per sample (T).
        seed: stream seed; sample i depends only on (seed, i).
        num_samples: stream length; None for endless.
    """

    def __init__(self, vocab_size: int, seq_len: int, seed: int = 0, num_samples: int | None = None) -> None:
        super().__init__()
        self.vocab_size, self.seq_len, self.seed, self.num_samples = vocab_size, seq_len, seed, num_samples
        self.next_index: int | None = None  # this rank's next global sample index (None: start of the stream)

    def sample(self, index: int) -> dict[str, torch.Tensor]:
        """Sample `index` of the global stream: input_ids [T] and labels [T] (labels = inputs shifted by one)."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        window = torch.randint(0, self.vocab_size, (self.seq_len + 1,), generator=gen)  # [T+1]
        return {"input_ids": window[:-1], "labels": window[1:]}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        rank, world = _rank_and_world()
        if self.next_index is None:
            self.next_index = rank
        while self.num_samples is None or self.next_index < self.num_samples:
            index = self.next_index
            self.next_index += world
            yield self.sample(index)
        self.next_index = None

    def state_dict(self) -> dict[str, Any]:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_index = state["next_index"]


class RandomTokenDataModule(pl.LightningDataModule):
    """Random tokens for throughput benchmarks and tests; `tokenizer` is None (text sampling is unavailable).

    Args:
        vocab_size: vocabulary of the random ids (and of the model built for it).
        seq_len: tokens per sequence (T).
        batch_size: sequences per micro-batch on one rank (B).
        seed: stream seed; validation uses seed + 1.
        val_batches: number of validation batches.
        pin_memory: pin batches (None: when CUDA is available; `klalm.data.loader.resolve_pin_memory`).
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        val_batches: int = 2,
        pin_memory: bool | None = None,
    ) -> None:
        super().__init__()
        if vocab_size < 2:
            raise ValueError(f"data.vocab_size={vocab_size} must be ≥ 2")
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.seed, self.val_batches, self.pin_memory = seed, val_batches, resolve_pin_memory(pin_memory)
        self.tokenizer = None

    def train_dataloader(self) -> ResumableLoader:
        dataset = RandomTokens(self.vocab_size, self.seq_len, self.seed)
        return ResumableLoader(dataset, batch_size=self.batch_size, pin_memory=self.pin_memory)

    def val_dataloader(self) -> ResumableLoader:
        dataset = RandomTokens(self.vocab_size, self.seq_len, self.seed + 1, self.val_batches * self.batch_size)
        return ResumableLoader(dataset, batch_size=self.batch_size, pin_memory=self.pin_memory)
