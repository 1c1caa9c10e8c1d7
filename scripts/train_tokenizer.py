"""Train a byte-level BPE tokenizer on a corpus and save it as a Hugging Face tokenizer folder.

    python scripts/train_tokenizer.py --data python_docs --vocab-size 4096 --out tokenizers/python_docs_4k
    python scripts/train_tokenizer.py --files '../shared/data/enwiki_2015/*.jsonl.gz' --vocab-size 16384 --out tok

The corpus is the training source of a configs/data/<data>.yaml file, or local files (--files, --field). Prints
the vocabulary size, the training time and the compression (UTF-8 bytes per token) on up to 200 documents.
Load the result with ``AutoTokenizer.from_pretrained(out)`` or the tokenizer config
``{kind: hf, name_or_path: <out>}``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from klalm.data.datamodule import files_source
from klalm.data.prepare import load_data_config
from klalm.data.records import expand_paths
from klalm.data.sources import build_source
from klalm.data.tokenizer import encode_texts, train_bpe_tokenizer
from klalm.errors import one_line


def _texts(source: dict, limit: int | None):
    records = build_source(source).stream(0, 1)
    return itertools.islice((r.text for r in records if r.problem is None), limit)


def training_source(name: str, overrides: list[str]) -> dict:
    """The training source of configs/data/<name>.yaml: its `source`, or for `data=files` (whose data module builds
    the source from `train` and `field`) the files it names.

    Raises:
        FileNotFoundError: no such data config (listing them).
        ValueError: a config with neither, or a `train` left unset.
    """
    config = load_data_config(name, overrides)
    if "source" in config:
        return OmegaConf.to_container(config.source, resolve=True)
    if "train" not in config or OmegaConf.is_missing(config, "train"):
        raise ValueError(f"--data {name}: no training source; give the files with --override train=<path or glob>")
    return files_source(config.train, config.get("field", "text"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--data", help="configs/data/<name>.yaml whose training source is the corpus")
    group.add_argument("--files", nargs="+", help="local files / glob patterns (jsonl, json, parquet, txt, compressed)")
    parser.add_argument("--field", default="text", help="text field for --files")
    parser.add_argument("--vocab-size", type=int, required=True, help="including the 256 byte tokens and EOS")
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--max-documents", type=int, default=None, help="train on at most this many (> 0)")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides of the data config")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.max_documents is not None and args.max_documents < 1:
        parser.error(f"--max-documents must be > 0 (leave it out for every document), got {args.max_documents}")
    try:
        source = training_source(args.data, args.override) if args.data else files_source(args.files, args.field)
        if source.get("kind") == "files":
            expand_paths(source["paths"])  # a pattern that matches no file, named before any work
        start = time.perf_counter()
        tokenizer = train_bpe_tokenizer(
            _texts(source, args.max_documents), args.vocab_size, args.out, min_frequency=args.min_frequency
        )
    except (FileNotFoundError, ValueError, KeyError) as err:
        sys.exit(f"train_tokenizer: {one_line(err)}")
    seconds = time.perf_counter() - start
    sample = list(_texts(source, 200))
    tokens = sum(len(ids) for ids in encode_texts(tokenizer, sample))
    size = sum(len(t.encode("utf-8")) for t in sample)
    print(
        f"saved {args.out}: vocab {len(tokenizer)}, trained in {seconds:.1f} s, "
        f"{size / max(tokens, 1):.2f} bytes/token on {len(sample)} documents"
    )


if __name__ == "__main__":
    main()
