"""Loss and perplexity of a checkpoint on a whole token-shard split (every window once, in order).

    python -m klalm.study.validate --checkpoint RUN/hf --shards data/shards/enwiki_full/val --out val.json

The split is cut into windows of T + 1 tokens as in training (T from the checkpoint's training length unless
--seq-len says otherwise); the tail shorter than one window is left out. Scored in bfloat16 autocast on a GPU (as
trained) or float32 on the CPU, with the log-softmax in float32.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import torch

from klalm.data.loader import windows_to_batch
from klalm.data.shards import TokenShards
from klalm.eval.checkpoint import load_checkpoint
from klalm.eval.perplexity import evaluate_loss


def validate(checkpoint: str | Path, shards: str | Path, *, seq_len: int = 2048, batch_size: int = 16) -> dict:
    """{"loss", "ppl", "tokens", "batches", "windows", "seq_len", "seconds"} of `checkpoint` on the whole split."""
    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = load_checkpoint(checkpoint, device=device, dtype="float32")
    tokens = TokenShards(shards)
    windows = len(tokens) // (seq_len + 1)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else nullcontext()
    with autocast:
        result = evaluate_loss(loaded.model, window_batches(tokens, seq_len, batch_size))
    return {**result, "windows": windows, "seq_len": seq_len, "seconds": time.perf_counter() - started}


def window_batches(tokens: TokenShards, seq_len: int, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """Every window of T + 1 tokens once, in order, `batch_size` at a time (the last batch may be smaller)."""
    width, windows = seq_len + 1, len(tokens) // (seq_len + 1)
    for first in range(0, windows, batch_size):
        count = min(batch_size, windows - first)
        block = tokens.read(first * width, count * width).reshape(count, width)  # [B, T+1]
        yield windows_to_batch(torch.from_numpy(block))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="HF export folder, .ckpt file or run folder")
    parser.add_argument("--shards", required=True, help="a shard split folder (holding index.json)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per window (T)")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per forward pass")
    parser.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    result = validate(args.checkpoint, args.shards, seq_len=args.seq_len, batch_size=args.batch_size)
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
