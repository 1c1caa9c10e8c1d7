"""`klalm-prepare-data`: pre-tokenise a data config's splits into memory-mapped token shards for full-speed runs.

    klalm-prepare-data --data enwiki_local --out data/shards/enwiki_gpt2
    klalm-prepare-data --data enwiki_local --out /tmp/s --splits val --max-documents 100 \\
        --override tokenizer.name_or_path=gpt2
    klalm-prepare-data --data files --override train='corpus/*.jsonl.gz' val=held_out.jsonl tokenizer=bpe \\
        --out data/shards/corpus

Reads configs/data/<data>.yaml (Hydra overrides of its keys allowed), writes <out>/train, <out>/val (uint16/uint32
shards + index.json) and <out>/tokenizer, and prints a Markdown table of tokens, documents, seconds and tokens/s.
Train afterwards with ``KLALM_SHARDS=<out> klalm-train data=shards``.
"""

from __future__ import annotations

import argparse
from importlib.resources import files
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from klalm.data.shards import SPLIT_KEYS, prepare_dataset


def data_config_names() -> list[str]:
    """The options of the `data` config group (configs/data/*.yaml)."""
    return sorted(
        p.name[: -len(".yaml")] for p in files("klalm.configs").joinpath("data").iterdir() if p.name.endswith(".yaml")
    )


def load_data_config(name: str, overrides: list[str]) -> DictConfig:
    """configs/data/<name>.yaml with Hydra overrides of its keys (unresolved; instantiate it to build the module).

    Raises:
        FileNotFoundError: no such data config (the message lists them).
    """
    if name not in data_config_names():
        raise FileNotFoundError(f"--data {name!r}: no configs/data/{name}.yaml; data configs: {data_config_names()}")
    with initialize_config_dir(config_dir=str(files("klalm.configs").joinpath("data")), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


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
    parser.add_argument("--max-documents", type=int, default=None, help="records per split (quick runs)")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides of the data config's keys")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of `klalm-prepare-data`; returns split -> shard index (with seconds and tokens/s)."""
    import hydra

    args = parse_args(argv)
    datamodule = hydra.utils.instantiate(load_data_config(args.data, args.override))
    results = prepare_dataset(
        datamodule.sources(),
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
