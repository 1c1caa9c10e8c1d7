"""What every synthetic task provides, and the two dataset wrappers built on it.

A task is a small frozen dataclass (its fields are the task's settings) with one method,
`sample(num_examples, generator, split)`, that returns a batch of whole examples as two LongTensors
`input_ids` [N, L] and `labels` [N, L]. Labels are aligned with the inputs, not shifted: the model's output
at position t is scored against `labels[:, t]`, and `klalm.loss.IGNORE_INDEX` (-100) marks positions that
are not scored.

Determinism: examples are produced in chunks of `CHUNK_SIZE`; chunk c of split s under seed x is generated
from its own `torch.Generator` seeded from (x, s, c), so any example can be regenerated on its own, the
train and test splits never share a random stream, and worker sharding does not change the data.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, IterableDataset, get_worker_info

CHUNK_SIZE = 512  # examples generated per random stream
MATERIALIZE_THREADS = min(16, os.cpu_count() or 1)  # chunks drawn side by side by `materialize`
Split = Literal["train", "test"]
SPLIT_IDS: dict[str, int] = {"train": 0, "test": 1}
# How a task is read out: "token" = the model's logits at each position; "last_position" = a decoder reads the
# whole sequence back from the final position's hidden state (MAD's compression task).
Readout = Literal["token", "last_position"]


@dataclasses.dataclass(frozen=True)
class SyntheticTask:
    """Base class of the synthetic tasks; subclasses add their settings as fields and implement `sample`."""

    readout: ClassVar[Readout] = "token"
    # MAD trains with fixed-size datasets; None means a fresh stream (A5) or a size given by the runner.
    num_train: ClassVar[int | None] = None
    num_test: ClassVar[int] = 1280

    @property
    def vocab_size(self) -> int:
        """V, token ids are in [0, V); by default the task's `vocab` setting."""
        return self.vocab

    @property
    def seq_len(self) -> int:
        """L, tokens per example; by default the task's `length` setting."""
        return self.length

    @property
    def scored_per_row(self) -> int | None:
        """K when every training row scores exactly K positions (MQAR: its K queries), else None. Training then
        computes the logits of those K positions only (klalm.tasks.train.stream_loss)."""
        return None

    def sample(self, num_examples: int, generator: torch.Generator, split: Split = "test") -> tuple[Tensor, Tensor]:
        """Draw `num_examples` examples.

        Args:
            num_examples: N, how many examples.
            generator: the CPU random stream that fully determines the result.
            split: "train" or "test"; tasks whose training targets differ from the scored ones (MAD's recall
                tasks train on every next token) use it, the others ignore it.

        Returns:
            (input_ids [N, L], labels [N, L]), int64, labels = -100 where not scored.
        """
        raise NotImplementedError


def chunk_generator(seed: int, split: Split, chunk: int) -> torch.Generator:
    """The CPU generator of one chunk: independent streams for every (seed, split, chunk)."""
    if split not in SPLIT_IDS:
        raise ValueError(f"unknown split {split!r}; valid: {sorted(SPLIT_IDS)}")
    state = np.random.SeedSequence([seed, SPLIT_IDS[split], chunk]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 ^ int(state[1]))


def generate_chunk(task: SyntheticTask, seed: int, split: Split, chunk: int, size: int = CHUNK_SIZE):
    """Examples [chunk * CHUNK_SIZE, chunk * CHUNK_SIZE + size) of a split: (input_ids [size, L], labels)."""
    return task.sample(size, chunk_generator(seed, split, chunk), split)


def materialize(task: SyntheticTask, num_examples: int, seed: int, split: Split) -> tuple[Tensor, Tensor]:
    """The first `num_examples` examples of a split as two int64 tensors [N, L] (same as `TaskDataset`).

    Chunks are drawn on up to `MATERIALIZE_THREADS` threads (torch releases the GIL inside its ops); each chunk has
    its own generator, so the result does not depend on the thread count.
    """
    if num_examples <= 0:
        raise ValueError(f"num_examples must be positive, got {num_examples}")
    num_chunks = (num_examples + CHUNK_SIZE - 1) // CHUNK_SIZE

    def draw(chunk: int) -> tuple[Tensor, Tensor]:
        return generate_chunk(task, seed, split, chunk, min(CHUNK_SIZE, num_examples - chunk * CHUNK_SIZE))

    with ThreadPoolExecutor(max_workers=max(1, min(MATERIALIZE_THREADS, num_chunks))) as pool:
        inputs, labels = zip(*pool.map(draw, range(num_chunks)))
    return torch.cat(inputs), torch.cat(labels)


def _example(inputs: Tensor, labels: Tensor) -> dict[str, Tensor]:
    return {"input_ids": inputs, "labels": labels}


class TaskDataset(Dataset):
    """A fixed, map-style split of a task: item i is {"input_ids": LongTensor[L], "labels": LongTensor[L]}.

    Args:
        task: the task.
        num_examples: split size.
        seed: data seed; (seed, split) fixes every example.
        split: "train" or "test".
    """

    def __init__(self, task: SyntheticTask, num_examples: int, seed: int = 0, split: Split = "train"):
        if num_examples <= 0:
            raise ValueError(f"num_examples must be positive, got {num_examples}")
        chunk_generator(seed, split, 0)  # validates split
        self.task, self.num_examples, self.seed, self.split = task, num_examples, seed, split
        self._cached: tuple[int, Tensor, Tensor] | None = None

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        if not -self.num_examples <= index < self.num_examples:
            raise IndexError(f"index {index} out of range for a split of {self.num_examples} examples")
        index %= self.num_examples
        chunk, offset = divmod(index, CHUNK_SIZE)
        if self._cached is None or self._cached[0] != chunk:
            size = min(CHUNK_SIZE, self.num_examples - chunk * CHUNK_SIZE)
            self._cached = (chunk, *generate_chunk(self.task, self.seed, self.split, chunk, size))
        _, inputs, labels = self._cached
        return _example(inputs[offset], labels[offset])


class TaskStream(IterableDataset):
    """An endless stream of fresh examples of a task; DataLoader workers take interleaved chunks.

    Args:
        task: the task.
        seed: data seed; the stream is the same for every number of workers only up to chunk order.
        split: "train" or "test".
    """

    def __init__(self, task: SyntheticTask, seed: int = 0, split: Split = "train"):
        chunk_generator(seed, split, 0)  # validates split
        self.task, self.seed, self.split = task, seed, split

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        chunk = worker
        while True:
            inputs, labels = generate_chunk(self.task, self.seed, self.split, chunk)
            for row in range(inputs.shape[0]):
                yield _example(inputs[row], labels[row])
            chunk += num_workers
