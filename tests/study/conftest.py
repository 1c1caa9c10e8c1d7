"""Fixtures for the study tests: a small token-shard folder, a study spec whose results go to a temporary folder, and a
finished run folder."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from klalm.data.prepare import ShardWriter
from klalm.study import results
from klalm.study.spec import Cell, load_spec

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


def write_run_dir(run_dir: Path, cell: Cell, lr: float, val_loss: float, gpus: int = 1, rate: float = 1000.0) -> None:
    """A run folder as the runner leaves it after a finished cell (files the results are made from)."""
    (run_dir / "csv").mkdir(parents=True)
    launch = {"cell": cell.name, "model": cell.model, "seed": cell.seed, "lr": lr, "sweep": cell.sweep,
              "gpus": gpus, "dynamics_lr_scale": 1.0, "data": {}, "versions": {}}  # fmt: skip
    (run_dir / results.CELL_FILE).write_text(json.dumps(launch))
    (run_dir / results.TIMING_FILE).write_text(json.dumps({"train": 120.0, "validate": 6.0, "zero_shot": 54.0}))
    (run_dir / results.VAL_FILE).write_text(json.dumps({"loss": val_loss, "ppl": 2.0, "tokens": 10}))
    (run_dir / "summary.json").write_text(json.dumps({"params": 7, "steps": 4, "tokens_seen": 256, "skipped_steps": 0}))
    (run_dir / "train.log").write_text("log\n")
    rows = [
        {"step": 2, "train/loss": 3.0, "train/lr": 1e-3, "train/grad_norm": 1.0, "train/tokens_seen": 128,
         "perf/tokens_per_s": 10.0, "val/loss": ""},
        {"step": 2, "train/loss": "", "train/lr": "", "train/grad_norm": "", "train/tokens_seen": "",
         "perf/tokens_per_s": "", "val/loss": 2.9},
        {"step": 4, "train/loss": 2.5, "train/lr": 5e-4, "train/grad_norm": 0.5, "train/tokens_seen": 256,
         "perf/tokens_per_s": rate, "val/loss": ""},
    ]  # fmt: skip
    with open(run_dir / "csv/metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if not cell.sweep:
        (run_dir / results.ZERO_SHOT_DIR).mkdir()
        (run_dir / results.ZERO_SHOT_DIR / "results.json").write_text(json.dumps({"results": {}}))
