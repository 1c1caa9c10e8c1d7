"""On-the-fly tokenisation and packing: documents -> EOS-separated token stream -> fixed windows -> batches.

Each consumer (one DataLoader worker of one rank) reads its share of the source in *blocks* of ``block_docs``
records, optionally permutes each block (a block shuffle whose permutation is a pure function of
(seed, epoch, consumer, block), so it needs no saved RNG), tokenises the block in one batch call, appends
EOS after every document, and cuts the stream into non-overlapping windows of ``seq_len + 1`` tokens:
``input_ids = w[:-1]``, ``labels = w[1:]``. Batching happens here (the DataLoader gets ``batch_size=None``),
so a consumer's state is complete at every batch boundary:

    {"consumer": [c, N], "epoch", "source": source position at the current block's start, "block",
     "offset": documents of the block already used, "buffer": tokens not yet in a window, "bad": skip counts,
     "batches": batches yielded, "epoch_docs": documents used this epoch}

On resume the block is re-read, re-permuted and re-tokenised, ``offset`` documents are skipped and the buffer
is restored, so the next batch is exactly the one the uninterrupted run would have produced.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Iterator
from typing import Any, Literal

import torch
from torch.utils.data import IterableDataset

from klalm.data.loader import NoDocumentsError, consumer_split, windows_to_batch
from klalm.data.records import BadRecordPolicy
from klalm.data.tokenizer import encode_texts

log = logging.getLogger(__name__)


def _copy_state(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of a consumer state that shares nothing mutable (cheaper than deepcopy: called every batch)."""
    return {
        **state,
        "consumer": list(state["consumer"]),
        "buffer": list(state["buffer"]),
        "bad": dict(state["bad"]),
        "source": copy.deepcopy(state["source"]),
    }


class PackedTextDataset(IterableDataset):
    """Packed, batched LM examples from a document source; resumable through ``state_dict``.

    Args:
        source: a document source (`klalm.data.sources`).
        tokenizer: HF tokenizer with an EOS token.
        seq_len: T, tokens per example (windows hold T + 1).
        batch_size: B, examples per batch (per rank).
        rank: this process's rank; world_size: number of ranks.
        seed: seed of the block shuffle.
        shuffle: permute documents within each block.
        block_docs: records read (and tokenised) at a time; also the shuffle span.
        loop: start a new epoch when the source is exhausted (training); False stops (the tail that does not
            fill a batch is dropped).
        num_batches: batches per rank (None: unbounded when looping, else until the source ends).
        on_bad_record: "raise" or "skip" (counted per reason in the state's "bad" entry).

    Yields:
        {"input_ids": LongTensor[B, T], "labels": LongTensor[B, T]}
    """

    def __init__(
        self,
        source: Any,
        tokenizer: Any,
        *,
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = False,
        block_docs: int = 64,
        loop: bool = True,
        num_batches: int | None = None,
        on_bad_record: Literal["raise", "skip"] = "raise",
    ):
        super().__init__()
        for name, value in {"seq_len": seq_len, "batch_size": batch_size, "block_docs": block_docs}.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        BadRecordPolicy(on_bad_record)  # validates the value early
        self.source, self.tokenizer = source, tokenizer
        self.seq_len, self.batch_size, self.rank, self.world_size = seq_len, batch_size, rank, world_size
        self.seed, self.shuffle, self.block_docs, self.loop = seed, shuffle, block_docs, loop
        self.num_batches, self.on_bad_record = num_batches, on_bad_record
        self.eos_id = tokenizer.eos_token_id
        self._state: dict[str, Any] | None = None
        self._resume: dict[str, Any] | None = None

    # -- Stateful protocol (called by torchdata's StatefulDataLoader, in the worker that owns this copy) --
    def state_dict(self) -> dict[str, Any]:
        state = self._state if self._state is not None else self._resume
        return _copy_state(state) if state is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = _copy_state(state) if state else None
        self._state = None

    def _fresh_state(self, consumer: int, num_consumers: int) -> dict[str, Any]:
        return {
            "consumer": [consumer, num_consumers],
            "epoch": 0,
            "source": None,
            "block": 0,
            "offset": 0,
            "buffer": [],
            "bad": {},
            "batches": 0,
            "epoch_docs": 0,
        }

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        consumer, num_consumers, quota = consumer_split(self.rank, self.world_size, self.num_batches)
        state = self._resume or self._fresh_state(consumer, num_consumers)
        self._resume = None
        if state["consumer"] != [consumer, num_consumers]:
            raise ValueError(
                f"data state was saved by consumer {state['consumer']} (index, count) but is being "
                f"loaded by consumer {[consumer, num_consumers]}: resume with the same world size and "
                "num_workers"
            )
        self._state = state
        policy = BadRecordPolicy(self.on_bad_record, state["bad"])
        documents = self._documents(state, policy, consumer, num_consumers)
        buffer, width = state["buffer"], self.seq_len + 1
        while quota is None or state["batches"] < quota:
            windows = []
            while len(windows) < self.batch_size:
                while len(buffer) < width:
                    tokens = next(documents, None)
                    if tokens is None:
                        return  # finite stream ended: the partial batch and the buffer tail are dropped
                    buffer.extend(tokens)
                    buffer.append(self.eos_id)
                windows.append(buffer[:width])
                del buffer[:width]
            state["batches"] += 1
            state["bad"] = dict(policy.counts)
            yield windows_to_batch(windows)

    def _read_block(self, stream_iter: Iterator[Any]) -> list[Any]:
        block = []
        for record in stream_iter:
            block.append(record)
            if len(block) == self.block_docs:
                break
        return block

    def _documents(self, state: dict, policy: BadRecordPolicy, consumer: int, n: int) -> Iterator[list[int]]:
        """Token lists of this consumer's documents, updating ``state`` as each one is handed out."""
        while True:
            stream = self.source.stream(consumer, n, state["source"])
            stream_iter = iter(stream)
            while block := self._read_block(stream_iter):
                order = list(range(len(block)))
                if self.shuffle:
                    random.Random(f"{self.seed}/{state['epoch']}/{consumer}/{n}/{state['block']}").shuffle(order)
                block = [block[i] for i in order][state["offset"] :]
                tokens = iter(encode_texts(self.tokenizer, [r.text for r in block if r.problem is None]))
                for record in block:
                    state["offset"] += 1
                    if policy.accept(record):  # raises, or counts the skip once (counts are saved in the state)
                        state["epoch_docs"] += 1
                        yield next(tokens)
                state["source"], state["block"], state["offset"] = stream.state_dict(), state["block"] + 1, 0
            if state["epoch_docs"] == 0:
                raise NoDocumentsError(
                    f"consumer {consumer}/{n} got no usable document in a full pass over "
                    f"{self.source.describe()} (skipped: {dict(policy.counts)}); the source has fewer "
                    "documents than ranks x workers, or every record is bad"
                )
            if not self.loop:
                return
            state.update(epoch=state["epoch"] + 1, source=None, block=0, offset=0, epoch_docs=0)
