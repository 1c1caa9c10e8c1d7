"""Data-pipeline throughput: streaming (read + tokenise + pack on the fly) vs pre-tokenised shards.

    python scripts/bench_data.py                           # enwiki from ../shared/data, GPT-2 BPE
    python scripts/bench_data.py --workers 0 1 2 --batches 300 --seq-len 1024 --batch-size 8

Prepares token shards of the same documents into a temporary folder first (timed: the "prepare" row), then times
each loader over --batches batches, start-up included (the time to the first batch is also shown), and prints a
Markdown table of tokens/s (input tokens, B x T per batch).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from klalm.data import PackedTextDataset, ResumableLoader, ShardDataset, ShardSource, build_source, load_tokenizer
from klalm.data.prepare import prepare_shards

DEFAULT_ROOT = os.environ.get("KLALM_SHARED_DATA", str(Path(__file__).resolve().parents[1].parent / "shared/data"))


def time_loader(loader: ResumableLoader, batches: int) -> tuple[float, float, int]:
    """(seconds to the first batch, seconds for all ``batches`` including the first, tokens in them).

    The whole run counts: a streaming worker tokenises a block of documents at a time, so its batches come in
    bursts and only a run over many blocks gives a fair rate.
    """
    start = time.perf_counter()
    iterator = iter(loader)
    tokens = next(iterator)["input_ids"].numel()
    first = time.perf_counter() - start
    tokens += sum(next(iterator)["input_ids"].numel() for _ in range(batches - 1))
    return first, time.perf_counter() - start, tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-root", default=DEFAULT_ROOT, help="the shared data folder (enwiki_2015, gpt2_tokenizer)"
    )
    parser.add_argument("--files", default="enwiki_2015/enwiki-0000[0-1]-of-00010.jsonl.gz", help="under data-root")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=300, help="timed batches per loader (start-up included)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    root = Path(args.data_root)
    source_config = {"kind": "files", "paths": str(root / args.files)}
    tokenizer_config = {"kind": "hf", "name_or_path": str(root / "gpt2_tokenizer")}
    tokenizer = load_tokenizer(tokenizer_config)
    common = dict(seq_len=args.seq_len, batch_size=args.batch_size, shuffle=True, seed=0)
    rows = []
    with tempfile.TemporaryDirectory() as shard_dir:
        index = prepare_shards(source_config, tokenizer_config, shard_dir, on_bad_record="skip", progress=False)
        rows.append(("prepare shards (1 process)", "-", None, index["seconds"], index["total_tokens"]))
        for workers in args.workers:
            stream = PackedTextDataset(build_source(source_config), tokenizer, on_bad_record="skip", **common)
            loader = ResumableLoader(stream, batch_size=None, num_workers=workers)
            rows.append(("streaming jsonl.gz + tokenise", workers, *time_loader(loader, args.batches)))
        for workers in args.workers:
            shards = ShardDataset(ShardSource(shard_dir), **common)
            loader = ResumableLoader(shards, batch_size=None, num_workers=workers)
            rows.append(("pre-tokenised shards (memmap)", workers, *time_loader(loader, args.batches)))
    print(
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, torch {torch.__version__}; "
        f"B={args.batch_size}, T={args.seq_len}, {args.batches} timed batches, source {args.files}"
    )
    print("| path | workers | first batch s | total s | tokens | tokens/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, workers, startup, seconds, tokens in rows:
        first = "-" if startup is None else f"{startup:.2f}"  # preparing has no first batch
        print(f"| {name} | {workers} | {first} | {seconds:.2f} | {tokens:,} | {tokens / seconds:,.0f} |")


if __name__ == "__main__":
    main()
