"""`klalm-prepare-data`: pre-tokenise a data config's splits into memory-mapped token shards for full-speed runs.

    klalm-prepare-data --data enwiki_local --out data/shards/enwiki_gpt2
    klalm-prepare-data --data enwiki_local --out data/shards/sample --splits val --max-documents 100 \\
        --override tokenizer.name_or_path=gpt2
    klalm-prepare-data --data files --override train='corpus/*.jsonl.gz' val=held_out.jsonl tokenizer=bpe \\
        --out data/shards/corpus

Reads configs/data/<data>.yaml (Hydra overrides of its keys allowed), writes <out>/train, <out>/val (uint16/uint32
shards + index.json, in the layout `klalm.data.shards` reads) and <out>/tokenizer, and prints a Markdown table of
tokens, documents, seconds and tokens/s.
Train afterwards with ``KLALM_SHARDS=<out> klalm-train data=shards``.
"""

# The command line only (this docstring is its --help), with nothing heavier than omegaconf (klalm.config_checks):
# `--help`, usage errors and refused flag values answer before klalm.data.prepare, which does the work, and with it
# torch, transformers and Lightning are imported.

from __future__ import annotations

import argparse
from pathlib import Path

from klalm.config_checks import SPLIT_KEYS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="klalm-prepare-data",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    parser.add_argument("--data", required=True, help="a data config (configs/data/<name>.yaml), e.g. enwiki_local")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--splits", nargs="+", default=list(SPLIT_KEYS), choices=sorted(SPLIT_KEYS))
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard file")
    parser.add_argument(
        "--max-documents",
        type=int,
        default=None,
        help="records per split (quick runs); a trained BPE (tokenizer=bpe) still learns from the whole training "
        "source: it is the cached one a full run and klalm-train use, so their tokens agree",
    )
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides of the data config's keys")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.shard_tokens < 1:
        parser.error(f"--shard-tokens must be > 0, got {args.shard_tokens}")
    if args.max_documents is not None and args.max_documents < 1:
        parser.error(f"--max-documents must be > 0 (leave it out for every record), got {args.max_documents}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file, not a folder")
    return args
