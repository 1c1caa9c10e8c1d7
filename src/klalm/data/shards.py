"""Pre-tokenised token shards, read memory-mapped at full speed (`klalm.data.prepare` writes them).

Layout of a shard folder::

    index.json          {"format": "klalm-tokens-v1", "dtype": "uint16"|"uint32", "eos_id", "vocab_size",
                         "tokenizer", "tokenizer_sha256", "source", "documents", "total_tokens", "skipped",
                         "shards": [{"file": "tokens-00000.bin", "tokens": n}, ...]}
    tokens-00000.bin    raw little-endian token ids; documents in source order, each followed by EOS

Reading (`ShardDataset`): the concatenated stream is cut into windows of T + 1 tokens (window k covers tokens
[k (T+1), (k+1)(T+1)), possibly across shard files); window k goes to consumer ``k % N`` (or, with shuffle, the
k-th entry of a per-epoch permutation seeded by (seed, epoch)). The state is (epoch, windows used): tiny and exact.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from klalm.data.loader import NoDocumentsError, consumer_split, windows_to_batch
from klalm.data.records import DataFileError
from klalm.errors import one_line

log = logging.getLogger(__name__)

INDEX_FILE = "index.json"
FORMAT = "klalm-tokens-v1"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
PREPARE_AGAIN = "prepare the folder again with klalm-prepare-data"


class TokenShards:
    """Read-only memory-mapped view of a shard folder as one token stream."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        index_file = self.path / INDEX_FILE
        if not index_file.exists():
            raise FileNotFoundError(f"no shard index {index_file} (create it with klalm-prepare-data)")
        try:
            self.index = json.loads(index_file.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataFileError(f"{index_file} is not a shard index ({one_line(err)}); {PREPARE_AGAIN}") from err
        for key in ("format", "dtype", "eos_id", "vocab_size", "shards"):
            if not isinstance(self.index, dict) or key not in self.index:
                raise DataFileError(f"{index_file} lacks key {key!r}; {PREPARE_AGAIN}")
        if self.index["format"] != FORMAT or self.index["dtype"] not in DTYPES:
            raise DataFileError(
                f"{index_file}: unsupported format/dtype {self.index['format']}/{self.index['dtype']}; {PREPARE_AGAIN}"
            )
        dtype = np.dtype(DTYPES[self.index["dtype"]]).newbyteorder("<")
        self.arrays = []
        for shard in self.index["shards"]:
            file = self.path / shard["file"]
            if not file.exists():
                raise FileNotFoundError(f"shard {file} listed in {index_file} is missing")
            size, expected = file.stat().st_size, shard["tokens"] * dtype.itemsize  # (numpy maps no empty file)
            if size != expected:
                says = f"{shard['tokens']} tokens ({expected} bytes)"
                raise DataFileError(f"{file} holds {size} bytes, index says {says}; {PREPARE_AGAIN}")
            self.arrays.append(np.memmap(file, dtype=dtype, mode="r") if size else np.zeros(0, dtype))
        self.offsets = np.cumsum([0] + [len(a) for a in self.arrays])  # start token of each shard

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the concatenated stream, as int64."""
        if start < 0 or start + length > len(self):
            raise IndexError(f"token range [{start}, {start + length}) outside [0, {len(self)})")
        out, shard = [], int(np.searchsorted(self.offsets, start, side="right") - 1)
        while length > 0:
            local = start - int(self.offsets[shard])
            piece = self.arrays[shard][local : local + length]
            out.append(piece)
            start, length, shard = start + len(piece), length - len(piece), shard + 1
        return np.concatenate(out).astype(np.int64)


class ShardSource:
    """Source config ``{"kind": "shards", "path": <shard folder>}`` (a token, not document, source)."""

    def __init__(self, path: str):
        self.shards = TokenShards(path)

    def describe(self) -> str:
        return f"shards {self.shards.path} ({len(self.shards)} tokens)"


class ShardDataset(IterableDataset):
    """Batches of windows from token shards; resumable via ``state_dict`` (same yields as `PackedTextDataset`).

    Args:
        source: a `ShardSource`.
        seq_len, batch_size, rank, world_size, seed, shuffle, loop, num_batches: as in `PackedTextDataset`
            (shuffle permutes all windows per epoch).
    """

    def __init__(
        self,
        source: ShardSource,
        *,
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = False,
        loop: bool = True,
        num_batches: int | None = None,
    ):
        super().__init__()
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
        self.shards = source.shards
        self.seq_len, self.batch_size, self.rank, self.world_size = seq_len, batch_size, rank, world_size
        self.seed, self.shuffle, self.loop, self.num_batches = seed, shuffle, loop, num_batches
        self._state: dict[str, Any] | None = None
        self._resume: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        state = self._state if self._state is not None else self._resume
        return dict(state) if state is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume, self._state = (dict(state) if state else None), None

    def _order(self, epoch: int, consumer: int, n: int) -> np.ndarray:
        num_windows = len(self.shards) // (self.seq_len + 1)
        order = np.arange(num_windows)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(num_windows)
        return order[consumer::n]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        consumer, n, quota = consumer_split(self.rank, self.world_size, self.num_batches)
        state = self._resume or {"consumer": [consumer, n], "epoch": 0, "pos": 0, "batches": 0}
        self._resume = None
        if state["consumer"] != [consumer, n]:
            raise ValueError(
                f"shard state saved by consumer {state['consumer']} loaded by {[consumer, n]}: "
                "resume with the same world size and num_workers"
            )
        self._state, width = state, self.seq_len + 1
        order = self._order(state["epoch"], consumer, n)
        if len(order) < self.batch_size:
            raise NoDocumentsError(
                f"consumer {consumer}/{n} gets {len(order)} windows of {width} tokens from "
                f"{self.shards.path}, fewer than one batch of {self.batch_size}"
            )
        while quota is None or state["batches"] < quota:
            if state["pos"] + self.batch_size > len(order):
                if not self.loop:
                    return
                state.update(epoch=state["epoch"] + 1, pos=0)
                order = self._order(state["epoch"], consumer, n)
            picks = order[state["pos"] : state["pos"] + self.batch_size]
            windows = torch.from_numpy(np.stack([self.shards.read(int(k) * width, width) for k in picks]))  # [B, T+1]
            state["pos"] += self.batch_size
            state["batches"] += 1
            yield windows_to_batch(windows)
