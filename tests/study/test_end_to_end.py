"""The whole study loop on the CPU with tiny models: stage, sweep, train (DDP-free), collect, report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from klalm.data.prepare import prepare_dataset
from klalm.study.cli import main
from klalm.study.spec import load_spec

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_study_runs_end_to_end_on_the_cpu(tmp_path, shared_data, monkeypatch):
    data = {
        "source": {"kind": "files", "paths": str(shared_data / "enwiki_2015/enwiki-00000-of-00010.jsonl.gz")},
        "val_source": {"kind": "files", "paths": str(shared_data / "enwiki_2015/enwiki-00009-of-00010.jsonl.gz")},
        "tokenizer": {"kind": "hf", "name_or_path": str(shared_data / "gpt2_tokenizer")},
        "on_bad_record": "skip",
    }
    prepare_dataset(data, tmp_path / "shards", max_documents=2, shard_tokens=4000, progress=False)
    raw = yaml.safe_load((REPO / "configs/study/enwiki_45m.yaml").read_text())
    (tmp_path / "results").mkdir()  # a new study's (the blocks refuse a missing one)
    raw.update(
        results=str(tmp_path / "results"),
        overrides=[
            "trainer=cpu",
            "data.seq_len=32",
            "data.batch_size=2",
            "data.num_workers=0",
            "train.global_batch_tokens=128",
            "train.val_every_n_steps=4",
            "trainer.log_every_n_steps=2",
            "data.val_batches=1",
            "callbacks.sampler.max_new_tokens=4",
            "model.n_layers=1",
        ],
        models={
            "gpt_tiny": {"lr": "sweep", "dynamics_lr_scale": 1.0},
            "kla_tiny": {"lr": "gpt_tiny", "dynamics_lr_scale": 0.1},
        },
        extra_seeds={},
        sweep={"lrs": {"gpt_tiny": [1e-3, 3e-3]}, "fraction": 0.25},
        eval={**raw["eval"], "limit": 4, "batch_size": 4},
        estimate={**raw["estimate"], "prior_tokens_per_s": {"gpt_tiny": 1e5, "kla_tiny": 1e5}},
        cost={**raw["cost"], "bench_rows": [str(REPO / p) for p in raw["cost"]["bench_rows"]]},
    )
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    common = ["--spec", str(spec_path), "--shards", str(tmp_path / "shards"), "--minutes", "30"]
    common += ["--work", str(tmp_path / "work"), "--eval-data", str(shared_data), "--commit", "test"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    assert main(["train", *common]) == 1  # no run can start before the sweep has chosen its learning rate
    assert main(["sweep", *common]) == 0
    assert main(["train", *common]) == 0
    spec = load_spec(str(spec_path))
    runs = sorted((tmp_path / "results/runs").iterdir())
    assert [p.name for p in runs] == ["gpt_tiny-s1234", "kla_tiny-s1234"]
    record = json.loads((runs[1] / "run.json").read_text())
    best = min((json.loads(p.read_text()) for p in (tmp_path / "results/sweep").glob("*/run.json")),
               key=lambda r: r["val"]["loss"])  # fmt: skip
    assert record["lr"] == best["lr"] and record["dynamics_lr_scale"] == 0.1 and record["commit"] == "test"
    assert record["tokens"] == record["steps"] * 128 and not record["data"]["partial"]
    results = json.loads((runs[1] / "eval.json").read_text())["results"]
    assert {t: v["n_evaluated"] for t, v in next(iter(results.values())).items()} == {"hellaswag": 4, "piqa": 4}
    assert main(["train", *common]) == 0  # nothing pending: a second block does nothing and succeeds

    doc = tmp_path / "RESULTS.md"
    shutil.copy(REPO / "docs/RESULTS.md", doc)
    assert main(["report", "--spec", str(spec_path), "--doc", str(doc)]) == 0
    assert "kla_tiny | 1234 | " in doc.read_text() and spec.models
