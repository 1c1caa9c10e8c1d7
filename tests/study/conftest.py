"""Fixtures for the study tests: a small token-shard folder and a study spec whose results go to a temporary folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from klalm.data.prepare import ShardWriter
from klalm.study.spec import load_spec

SEQ_LEN = 16
TRAIN_DOCS = [list(range(i, i + 40 + 7 * i)) for i in range(30)]  # 30 documents of 40-243 ids, each + EOS
VAL_DOCS = [list(range(100, 160))] * 5


def write_split(folder: Path, docs: list[list[int]], shard_tokens: int) -> dict:
    writer = ShardWriter(folder, "uint16", eos_id=0, shard_tokens=shard_tokens)
    for doc in docs:
        writer.add(doc)
    return writer.close({"vocab_size": 512, "tokenizer": "test", "source": {}, "skipped": {}})


@pytest.fixture
def shard_folder(tmp_path: Path) -> Path:
    """train/ in several shard files, val/ in one, tokenizer/ with two small files."""
    root = tmp_path / "shards"
    write_split(root / "train", TRAIN_DOCS, shard_tokens=1000)
    write_split(root / "val", VAL_DOCS, shard_tokens=10_000)
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.json").write_text(json.dumps({"model": "test"}))
    (root / "tokenizer" / "tokenizer_config.json").write_text("{}")
    return root


def spec_file(tmp_path: Path, **changes) -> Path:
    """The shipped spec with its results folder moved to tmp_path and `changes` applied to its top-level keys."""
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/study/enwiki_45m.yaml").read_text())
    raw.update(results=str(tmp_path / "results"), **changes)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def spec(tmp_path: Path):
    return load_spec(str(spec_file(tmp_path)))


def tokens_of(folder: Path) -> np.ndarray:
    index = json.loads((folder / "index.json").read_text())
    return np.concatenate([np.fromfile(folder / s["file"], dtype="<u2") for s in index["shards"]])
