"""Pre-tokenised token shards: write them once (`prepare_shards`), read them memory-mapped at full speed.

Layout of a shard folder::

    index.json          {"format": "klalm-tokens-v1", "dtype": "uint16"|"uint32", "eos_id", "vocab_size",
                         "tokenizer", "source", "documents", "total_tokens", "skipped",
                         "shards": [{"file": "tokens-00000.bin", "tokens": n}, ...]}
    tokens-00000.bin    raw little-endian token ids; documents in source order, each followed by EOS

Reading (`ShardDataset`): the concatenated stream is cut into windows of T + 1 tokens (window k covers tokens
[k (T+1), (k+1)(T+1)), possibly across shard files); window k goes to consumer ``k % N`` (or, with shuffle, the
k-th entry of a per-epoch permutation seeded by (seed, epoch)). The state is (epoch, windows used): tiny and exact.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import IterableDataset

from klalm.data.packing import consumer_split, windows_to_batch

log = logging.getLogger(__name__)

INDEX_FILE = "index.json"
FORMAT = "klalm-tokens-v1"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def choose_dtype(vocab_size: int) -> str:
    """The narrowest supported dtype holding every id of a vocabulary."""
    for name, dtype in DTYPES.items():
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return name
    raise ValueError(f"vocab_size {vocab_size} does not fit in {sorted(DTYPES)}")


class ShardWriter:
    """Appends documents (token lists) to ``tokens-NNNNN.bin`` files of at most ``shard_tokens`` tokens."""

    def __init__(self, out_dir: Path, dtype: str, eos_id: int, shard_tokens: int):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.out_dir, self.dtype, self.eos_id, self.shard_tokens = out_dir, DTYPES[dtype], eos_id, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.documents = 0
        self.total_tokens = 0
        self._file = None
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, tokens: list[int]) -> None:
        array = np.asarray([*tokens, self.eos_id], dtype=np.int64)
        if array.max(initial=0) > np.iinfo(self.dtype).max:
            raise ValueError(f"token id {array.max()} does not fit in {np.dtype(self.dtype).name}")
        array = array.astype(self.dtype)
        while len(array):
            if self._file is None or self.shards[-1]["tokens"] >= self.shard_tokens:
                self._open_next()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            chunk, array = array[:room], array[room:]
            self._file.write(chunk.astype(np.dtype(self.dtype).newbyteorder("<"), copy=False).tobytes())
            self.shards[-1]["tokens"] += len(chunk)
            self.total_tokens += len(chunk)
        self.documents += 1

    def _open_next(self) -> None:
        if self._file is not None:
            self._file.close()
        name = f"tokens-{len(self.shards):05d}.bin"
        self._file = open(self.out_dir / name, "wb")  # noqa: SIM115 (kept open across add() calls; close() closes)
        self.shards.append({"file": name, "tokens": 0})

    def close(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Closes the last shard and writes ``index.json``; returns the index."""
        if self._file is not None:
            self._file.close()
        index = {
            "format": FORMAT,
            "dtype": np.dtype(self.dtype).name,
            "eos_id": self.eos_id,
            **meta,
            "documents": self.documents,
            "total_tokens": self.total_tokens,
            "shards": self.shards,
        }
        (self.out_dir / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n")
        return index


def prepare_shards(
    source: dict[str, Any],
    tokenizer: dict[str, Any],
    out_dir: str | Path,
    *,
    shard_tokens: int = 100_000_000,
    dtype: str = "auto",
    block_docs: int = 256,
    on_bad_record: Literal["raise", "skip"] = "raise",
    progress: bool = True,
) -> dict[str, Any]:
    """Tokenises a whole source, in order, into token shards with an index (see module docstring).

    Args:
        source: source config (`klalm.data.sources.build_source`), e.g. the enwiki train files.
        tokenizer: tokenizer config (`klalm.data.tokenizer.load_tokenizer`).
        out_dir: output folder (created; an existing index there is overwritten).
        shard_tokens: tokens per shard file.
        dtype: "uint16", "uint32" or "auto" (uint16 when the vocabulary fits).
        block_docs: documents tokenised per batch call.
        on_bad_record: "raise" or "skip" (skips are counted in the index's "skipped").
        progress: show a tqdm bar with tokens/s.

    Returns:
        the index dict, plus "seconds" and "tokens_per_s".
    """
    from tqdm import tqdm

    from klalm.data.records import BadRecordPolicy
    from klalm.data.sources import build_source
    from klalm.data.tokenizer import encode_texts, load_tokenizer

    tok = load_tokenizer(tokenizer)
    dtype = choose_dtype(len(tok)) if dtype == "auto" else dtype
    src, policy = build_source(source), BadRecordPolicy(on_bad_record)
    writer = ShardWriter(Path(out_dir), dtype, tok.eos_token_id, shard_tokens)
    start = time.perf_counter()
    bar = tqdm(unit="tok", unit_scale=True, disable=not progress, desc=f"tokenising -> {out_dir}")
    block: list[str] = []
    for record in [*src.stream(0, 1), None]:
        if record is not None and policy.accept(record):
            block.append(record.text)
        if block and (record is None or len(block) == block_docs):
            for ids in encode_texts(tok, block):
                writer.add(ids)
                bar.update(len(ids) + 1)
            block = []
            bar.set_postfix(docs=writer.documents)
    bar.close()
    seconds = time.perf_counter() - start
    meta = {"vocab_size": len(tok), "tokenizer": tok.name_or_path, "source": source, "skipped": dict(policy.counts)}
    index = writer.close(meta)
    return {**index, "seconds": seconds, "tokens_per_s": index["total_tokens"] / max(seconds, 1e-9)}


SPLIT_KEYS = {"train": "source", "val": "val_source"}  # split name -> key of the data config holding its source


def prepare_dataset(
    data_config: dict[str, Any],
    out_dir: str | Path,
    *,
    splits: tuple[str, ...] = ("train", "val"),
    shard_tokens: int = 100_000_000,
    max_documents: int | None = None,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Shards every split of a data config (``configs/data/*.yaml``) into ``out_dir/<split>``, and saves the
    tokenizer into ``out_dir/tokenizer`` so ``configs/data/shards.yaml`` (KLALM_SHARDS=out_dir) runs from it alone.

    Args:
        data_config: a resolved data config (keys source, val_source, tokenizer, on_bad_record).
        out_dir: output folder.
        splits: which of "train" (``source``) and "val" (``val_source``) to prepare.
        shard_tokens: tokens per shard file.
        max_documents: cap on records per split (for quick runs).
        progress: show progress bars.

    Returns:
        split -> index (with seconds and tokens_per_s).
    """
    from klalm.data.tokenizer import load_tokenizer

    out_dir = Path(out_dir)
    results = {}
    for split in splits:
        if split not in SPLIT_KEYS:
            raise KeyError(f"unknown split {split!r}; valid: {sorted(SPLIT_KEYS)}")
        source = data_config.get(SPLIT_KEYS[split])
        if source is None:
            raise KeyError(f"data config has no {SPLIT_KEYS[split]!r} for split {split!r}")
        if max_documents is not None:
            source = {**source, "max_documents": max_documents}
        results[split] = prepare_shards(
            source,
            data_config["tokenizer"],
            out_dir / split,
            shard_tokens=shard_tokens,
            on_bad_record=data_config.get("on_bad_record", "raise"),
            progress=progress,
        )
    load_tokenizer(data_config["tokenizer"]).save_pretrained(str(out_dir / "tokenizer"))
    return results


class TokenShards:
    """Read-only memory-mapped view of a shard folder as one token stream."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        index_file = self.path / INDEX_FILE
        if not index_file.exists():
            raise FileNotFoundError(f"no shard index {index_file} (create it with klalm-prepare-data)")
        self.index = json.loads(index_file.read_text())
        for key in ("format", "dtype", "eos_id", "vocab_size", "shards"):
            if key not in self.index:
                raise KeyError(f"{index_file} lacks key {key!r}")
        if self.index["format"] != FORMAT or self.index["dtype"] not in DTYPES:
            raise ValueError(f"{index_file}: unsupported format/dtype {self.index['format']}/{self.index['dtype']}")
        dtype = np.dtype(DTYPES[self.index["dtype"]]).newbyteorder("<")
        self.arrays = []
        for shard in self.index["shards"]:
            file = self.path / shard["file"]
            if not file.exists():
                raise FileNotFoundError(f"shard {file} listed in {index_file} is missing")
            array = np.memmap(file, dtype=dtype, mode="r")
            if len(array) != shard["tokens"]:
                raise ValueError(f"{file} holds {len(array)} tokens, index says {shard['tokens']}")
            self.arrays.append(array)
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
            raise ValueError(
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
