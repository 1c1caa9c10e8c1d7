"""Pre-tokenise a corpus into memory-mapped token shards (uint16/uint32 + index.json) for full-speed GPU runs.

    python scripts/prepare_data.py --data enwiki_local --out data/shards/enwiki_gpt2
    python scripts/prepare_data.py --data enwiki_local --out /tmp/s --splits val --max-documents 100 \\
        --override tokenizer.name_or_path=gpt2

Reads configs/data/<data>.yaml (Hydra overrides allowed), writes <out>/train, <out>/val and <out>/tokenizer, and
prints a Markdown table of tokens, documents, seconds and tokens/s. Train afterwards with
``KLALM_SHARDS=<out> klalm-train data=shards``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from klalm.data.shards import SPLIT_KEYS, prepare_dataset

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "data"


def load_data_config(name: str, overrides: list[str]) -> dict:
    """configs/data/<name>.yaml with Hydra overrides, interpolations resolved, as a plain dict."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        config = compose(config_name=name, overrides=overrides)
    return OmegaConf.to_container(config, resolve=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="name of a configs/data/*.yaml file, e.g. enwiki_local")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--splits", nargs="+", default=list(SPLIT_KEYS), choices=sorted(SPLIT_KEYS))
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard file")
    parser.add_argument("--max-documents", type=int, default=None, help="records per split (quick runs)")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides of the data config")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    config = load_data_config(args.data, args.override)
    results = prepare_dataset(
        config,
        args.out,
        splits=tuple(args.splits),
        shard_tokens=args.shard_tokens,
        max_documents=args.max_documents,
        progress=not args.no_progress,
    )
    print("| split | documents | tokens | shards | dtype | skipped | seconds | tokens/s |")
    print("| --- | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    for split, r in results.items():
        print(
            f"| {split} | {r['documents']:,} | {r['total_tokens']:,} | {len(r['shards'])} | {r['dtype']} | "
            f"{r['skipped'] or '-'} | {r['seconds']:.1f} | {r['tokens_per_s']:,.0f} |"
        )
    return results


if __name__ == "__main__":
    main()
