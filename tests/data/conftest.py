"""Fixtures for the data tests: the real enwiki shards and GPT-2 tokenizer from ../shared/data, loaded once."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from klalm.data.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def enwiki(shared_data: Path) -> Path:
    return shared_data / "enwiki_2015"


@pytest.fixture(scope="session")
def gpt2_config(shared_data: Path) -> dict:
    return {"kind": "hf", "name_or_path": str(shared_data / "gpt2_tokenizer")}


@pytest.fixture(scope="session")
def gpt2(gpt2_config: dict):
    return load_tokenizer(gpt2_config)


@pytest.fixture
def files_args(tmp_path, shared_data) -> list[str]:
    """`klalm-prepare-data --data files` over one tiny jsonl file with the local GPT-2 tokenizer (no network); add
    val=... to it."""
    (tmp_path / "ok.jsonl").write_text(json.dumps({"text": "hello world"}) + "\n")
    return [
        "--data",
        "files",
        "--override",
        f"train={tmp_path / 'ok.jsonl'}",
        f"tokenizer={shared_data / 'gpt2_tokenizer'}",
    ]


def read_texts(files: list[Path], limit: int | None = None) -> list[str | None]:
    """Oracle reader (plain gzip + json, independent of klalm.data.records): text per record, None if empty."""
    texts: list[str | None] = []
    for file in files:
        with gzip.open(file, "rt", encoding="utf-8") as f:
            for line in f:
                if limit is not None and len(texts) == limit:
                    return texts
                if line.strip():
                    text = json.loads(line)["text"]
                    texts.append(text if text.strip() else None)
    return texts


def oracle_windows(tokenizer, texts: list[str | None], consumer: int, num_consumers: int, width: int) -> list:
    """Windows of ``width`` tokens of one consumer's EOS-joined documents (records r with r % N == c)."""
    stream: list[int] = []
    for index, text in enumerate(texts):
        if index % num_consumers == consumer and text is not None:
            stream += tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return [tuple(stream[k : k + width]) for k in range(0, len(stream) - width + 1, width)]


@pytest.fixture(scope="session")
def klalm_cache(tmp_path_factory) -> Path:
    """One cache folder per test session: the python_docs corpus is extracted once (~10 s on a busy 2-core box)."""
    return tmp_path_factory.mktemp("klalm_cache")
