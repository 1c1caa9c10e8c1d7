"""Tokenisers: any Hugging Face tokenizer (hub name or local folder), or a byte-level BPE trained on a corpus.

Registry (``kind`` key of a tokenizer config):
- ``hf``: ``AutoTokenizer.from_pretrained(name_or_path)``, e.g. ``gpt2`` or ``../shared/data/gpt2_tokenizer``.
- ``trained_bpe``: a byte-level BPE trained once on a source (``train_bpe_tokenizer``) and cached as an HF
  tokenizer folder under ``cache_dir``; later runs load the cache.

Every tokenizer must define an EOS token: documents are separated by it when packed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from klalm.data.hub import hub_unreachable
from klalm.data.sources import build_source
from klalm.errors import one_line

log = logging.getLogger(__name__)

DEFAULT_EOS = "<|endoftext|>"


def load_hf_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """A Hugging Face tokenizer by local folder (which must exist) or hub id.

    A hub id is taken from the local Hugging Face cache when it is there (no network: offline runs start at once)
    and only otherwise downloaded; a hub that cannot provide it (offline, unknown id) is a FileNotFoundError on one
    line, the error `klalm-train` and `klalm-prepare-data` refuse with, instead of a wrapped multi-line OSError. A hub
    that cannot be reached (`klalm.data.hub`) is refused before the download, not after its retries.
    """
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        try:
            return AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError) as err:  # no tokenizer files, or unreadable ones: transformers names neither
            reason = one_line(err)  # for an empty folder "Couldn't instantiate the backend tokenizer from one of:"
            reason = (
                "no tokenizer.json, nor vocabulary files with a tokenizer_config.json"
                if reason.endswith(":")
                else reason
            )
            raise FileNotFoundError(f"no usable tokenizer in folder {folder} ({reason})") from err
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:  # hub ids are "name" or "org/name"
        raise FileNotFoundError(f"tokenizer folder {folder} does not exist")
    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except OSError:
        pass  # not cached yet
    reason = hub_unreachable()  # asked first: offline, huggingface_hub would retry each file for ~50 s
    if reason is None:
        try:
            return AutoTokenizer.from_pretrained(name_or_path)
        except OSError as err:
            reason = one_line(err)
    raise FileNotFoundError(
        f"tokenizer {name_or_path!r} is not a local folder, not in the Hugging Face cache and not available from "
        f"the hub ({reason}): name a local tokenizer folder (with data=files, data.tokenizer=bpe trains one)"
    )


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int, out_dir: str | Path, *, min_frequency: int = 2, eos_token: str = DEFAULT_EOS
) -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE (GPT-2 style pre-tokenisation, no unknown tokens) and saves it as an HF folder.

    Args:
        texts: training documents.
        vocab_size: final vocabulary size, including the 256 byte tokens and the EOS token.
        out_dir: folder to write (``tokenizer.json`` + config); loadable with ``AutoTokenizer.from_pretrained``.
        min_frequency: minimum pair count for a merge.
        eos_token: the end-of-document token (also BOS/UNK/PAD-free: only EOS is special).

    Returns:
        the trained tokenizer; ``len(tokenizer) == vocab_size`` when the corpus has enough distinct merges.

    Raises:
        ValueError: ``vocab_size`` < 257, or no text (a tokenizer of the bytes alone would be saved as if asked for).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"vocab_size must be > 256 (the byte alphabet plus EOS), got {vocab_size}")
    texts = iter(texts)
    first = next(texts, None)
    if first is None:
        raise ValueError("no document to train a BPE tokenizer on: the corpus is empty or every record is bad")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(itertools.chain([first], texts), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos_token, bos_token=eos_token)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(str(out_dir))
    return wrapped


def _source_texts(source: Any) -> Iterator[str]:
    for record in source.stream(0, 1):
        if record.problem is None:
            yield record.text


def _file_identity(path: Path) -> list[Any]:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def load_or_train_bpe(
    source: dict[str, Any], vocab_size: int = 4096, cache_dir: str = "~/.cache/klalm", min_frequency: int = 2
) -> PreTrainedTokenizerBase:
    """A BPE trained on ``source`` (a source config), cached under ``cache_dir`` by a hash of its settings and, for
    a source of local files, of each file's path, size and modification time: an edited corpus trains a new one.

    Raises:
        ValueError: the source holds no usable document (an empty file would otherwise give a BPE of bytes only).
    """
    built = build_source(source)
    settings = {
        "source": source,
        "vocab_size": vocab_size,
        "min_frequency": min_frequency,
        "python": sys.version_info[:3],
    }
    if hasattr(built, "files"):  # not hashed: reading the whole corpus would slow every start, cache hits included
        settings["files"] = [_file_identity(path) for path in built.files]
    key = json.dumps(settings, sort_keys=True, default=str)
    folder = Path(cache_dir).expanduser() / f"bpe-{vocab_size}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if not (folder / "tokenizer.json").exists():
        texts = _source_texts(built)
        first = next(texts, None)
        if first is None:
            raise ValueError(f"cannot train a BPE tokenizer: {built.describe()} holds no usable document")
        log.info("training a %d-token byte-level BPE on %s into %s", vocab_size, source.get("kind"), folder)
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        train_bpe_tokenizer(itertools.chain([first], texts), vocab_size, tmp, min_frequency=min_frequency)
        (tmp / "klalm_tokenizer.json").write_text(key + "\n")
        try:
            os.replace(tmp, folder)  # atomic: concurrent ranks either win or find the folder already there
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return AutoTokenizer.from_pretrained(str(folder))


TOKENIZERS: dict[str, Any] = {
    "hf": load_hf_tokenizer,
    "trained_bpe": load_or_train_bpe,
}

TRAINED_BPE_NAME = "bpe"  # the short tokenizer name that means "a BPE trained on the training corpus"


def named_tokenizer(name: str, corpus: dict[str, Any], *, bpe_vocab_size: int, cache_dir: str) -> dict[str, Any]:
    """The tokenizer config meant by a short name: "bpe" trains a byte-level BPE on `corpus` (a source config,
    once, cached under `cache_dir`); anything else is a Hugging Face tokenizer, a hub name such as "gpt2" or a local
    folder."""
    if name == TRAINED_BPE_NAME:
        return {"kind": "trained_bpe", "source": corpus, "vocab_size": bpe_vocab_size, "cache_dir": cache_dir}
    return {"kind": "hf", "name_or_path": name}


def load_tokenizer(config: dict[str, Any]) -> PreTrainedTokenizerBase:
    """Builds a tokenizer from ``{"kind": <one of TOKENIZERS>, **arguments}``; checks it has an EOS token.

    Raises:
        KeyError: missing or unknown ``kind``.
        ValueError: the tokenizer has no EOS token.
    """
    if not isinstance(config, Mapping):  # e.g. data.tokenizer=foo where the data config expects a mapping
        raise ValueError(f"tokenizer must be a mapping with a 'kind' key, one of {sorted(TOKENIZERS)}; got {config!r}")
    config = dict(config)
    if "kind" not in config:
        raise KeyError(f"tokenizer config needs a 'kind' key, one of {sorted(TOKENIZERS)}; got {sorted(config)}")
    kind = config.pop("kind")
    if kind not in TOKENIZERS:
        raise KeyError(f"unknown tokenizer kind {kind!r}; valid kinds: {sorted(TOKENIZERS)}")
    tokenizer = TOKENIZERS[kind](**config)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {config} has no EOS token; packing needs one to separate documents")
    return tokenizer


def tokenizer_sha256(tokenizer: PreTrainedTokenizerBase) -> str:
    """The identity of a tokenizer, the same wherever it is loaded from (a saved copy, the cache): the SHA-256 of a
    fast tokenizer's whole definition (vocabulary, merges, normaliser, pre-tokeniser, added tokens), of a slow one's
    vocabulary. Two tokenizers of one vocabulary size but other tokens differ in it. The backend's `truncation` and
    `padding` settings are left out: a call such as `tokenizer(text, truncation=True, max_length=16)` changes them."""
    if tokenizer.is_fast:
        definition = json.loads(tokenizer.backend_tokenizer.to_str())
        definition.pop("truncation", None)
        definition.pop("padding", None)
    else:
        definition = tokenizer.get_vocab()
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()


def tokenizer_meta(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """What a shard index records of the tokenizer that wrote it: name, vocabulary size and `tokenizer_sha256`."""
    return {
        "vocab_size": len(tokenizer),
        "tokenizer": tokenizer.name_or_path,
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
    }


def same_tokenizer(recorded: Mapping[str, Any], meta: Mapping[str, Any]) -> bool:
    """Whether a shard index's tokenizer (``recorded``) is the one of ``meta`` (a `tokenizer_meta`): compared by
    `tokenizer_sha256` (a vocabulary of the same size passed when only the sizes were), an index written before it
    was recorded (2026-12-06) by its vocabulary size."""
    key = "tokenizer_sha256" if "tokenizer_sha256" in recorded else "vocab_size"
    return recorded.get(key) == meta[key]


def tokenizer_label(meta: Mapping[str, Any]) -> str:
    """A tokenizer as an error names it, from its `tokenizer_meta` (or an older shard index's part of it)."""
    digest = meta.get("tokenizer_sha256")
    return f"{meta.get('tokenizer')} (vocab {meta.get('vocab_size')}{f', sha256 {digest[:12]}' if digest else ''})"


def encode_texts(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens (the Rust batch encoder when the tokenizer is fast)."""
    if not texts:
        return []
    if tokenizer.is_fast:
        return [e.ids for e in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def decode_tokens(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """Exact inverse of `encode_texts` for byte-level BPEs (no whitespace clean-up)."""
    return tokenizer.decode(ids, clean_up_tokenization_spaces=False)
