"""Your own files in one line: `data=files data.train=... data.val=... data.tokenizer=...`, and klalm-prepare-data."""

from __future__ import annotations

import gzip
import inspect
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from klalm.cli.prepare_data_args import parse_args
from klalm.config_checks import config_group_options
from klalm.data import TextDataModule, local_files
from klalm.data.loader import NoDocumentsError
from klalm.data.prepare import load_data_config, run
from klalm.data.shards import TokenShards

from .conftest import read_texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, enwiki) -> dict[str, Path]:
    """The first 24 enwiki articles as jsonl.gz (train), parquet (validation) and zstd-compressed txt files."""
    texts = [t for t in read_texts([enwiki / "enwiki-00000-of-00010.jsonl.gz"], limit=30) if t][:24]
    root = tmp_path_factory.mktemp("corpus")
    with gzip.open(root / "train.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"body": t}) + "\n" for t in texts[:16])
    pq.write_table(pa.table({"body": texts[16:]}), root / "val.parquet")
    (root / "txt").mkdir()
    for i, text in enumerate(texts[:4]):
        (root / "txt" / f"doc{i}.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    return {"train": root / "train.jsonl.gz", "val": root / "val.parquet", "txt": root / "txt" / "*.txt.zst"}


def _compose_train(overrides: list[str]):
    with initialize_config_module("klalm.configs", version_base="1.3"):
        return compose("train", overrides=overrides)


def test_one_line_composes_into_a_working_data_module(corpus, shared_data):
    cfg = _compose_train(
        ["data=files", f"data.train={corpus['train']}", f"data.val={corpus['val']}",
         f"data.tokenizer={shared_data / 'gpt2_tokenizer'}", "data.field=body", "data.seq_len=32",
         "data.batch_size=2", "data.num_workers=0", "data.val_batches=2"]
    )  # fmt: skip
    module = instantiate(cfg.data)
    assert isinstance(module, TextDataModule) and len(module.tokenizer) == 50257
    assert module.source_config == {"kind": "files", "paths": str(corpus["train"]), "field": "body"}
    batch = next(iter(module.train_dataloader()))
    assert batch["input_ids"].shape == (2, 32)
    assert len(list(module.val_dataloader())) == 2


def test_validation_files_that_give_a_consumer_no_document_are_refused_before_fitting(corpus, shared_data, tmp_path):
    """The CPU trainer config runs no sanity validation: an empty data.val was found at the first validation, after
    train.val_every_n_steps steps (52 s into a smoke run). Now at Lightning's setup, before the first step."""
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "one.jsonl").write_text('{"body": "one document"}\n')
    options = {"tokenizer": str(shared_data / "gpt2_tokenizer"), "field": "body", "seq_len": 8, "batch_size": 2}
    empty = local_files(str(corpus["train"]), str(tmp_path / "empty.jsonl"), num_workers=0, **options)
    with pytest.raises(NoDocumentsError) as err:
        empty.setup("fit")
    assert str(err.value) == (
        f"validation source files ['{tmp_path / 'empty.jsonl'}'] field='body' gives consumer 0 of 1 (ranks x loader "
        "workers) no usable document: it holds fewer than the consumers, or none"
    )
    empty.setup("validate")  # (checked for fitting only)
    empty.trainer = SimpleNamespace(limit_val_batches=0)  # a run that never validates: Lightning never asks for it
    empty.setup("fit")
    local_files(str(corpus["train"]), str(tmp_path / "one.jsonl"), num_workers=0, **options).setup("fit")  # wraps
    two_workers = local_files(str(corpus["train"]), str(tmp_path / "one.jsonl"), num_workers=2, **options)
    with pytest.raises(NoDocumentsError, match="gives consumer 1 of 2 "):
        two_workers.setup("fit")
    one_batch = local_files(str(corpus["train"]), str(tmp_path / "one.jsonl"), num_workers=2, val_batches=1, **options)
    one_batch.setup("fit")  # the second worker has no batch to give: it reads nothing
    assert len(list(one_batch.val_dataloader())) == 1


def test_trained_bpe_on_compressed_txt_and_no_validation(corpus, tmp_path):
    module = local_files(str(corpus["txt"]), tokenizer="bpe", bpe_vocab_size=300, cache_dir=str(tmp_path),
                         seq_len=16, batch_size=2)  # fmt: skip
    assert len(module.tokenizer) == 300 and module.tokenizer_config["kind"] == "trained_bpe"
    assert next(iter(module.train_dataloader()))["input_ids"].shape == (2, 16)
    assert module.val_dataloader() == []


def test_a_missing_file_or_tokenizer_folder_is_named(corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="no file matches .*nothing-here"):
        local_files(str(tmp_path / "nothing-here*.jsonl"), tokenizer="bpe", cache_dir=str(tmp_path), seq_len=8,
                    batch_size=1)  # fmt: skip
    with pytest.raises(FileNotFoundError, match="tokenizer folder .*no-tokenizer"):
        local_files(str(corpus["train"]), tokenizer=str(tmp_path / "no-tokenizer"), seq_len=8, batch_size=1)


def test_a_missing_file_is_named_before_the_tokenizer_is_fetched(corpus, tmp_path, monkeypatch):
    """With a hub tokenizer on an offline machine, the tokenizer's fetch would retry the network for half a minute
    and report that instead: the files are checked first (a missing val file too)."""
    import klalm.data.datamodule as datamodule

    def no_tokenizer(*args, **kwargs):
        raise AssertionError("the tokenizer was looked up before the files were checked")

    monkeypatch.setattr(datamodule, "named_tokenizer", no_tokenizer)
    for train, val in ((tmp_path / "nothing*.jsonl", None), (corpus["train"], tmp_path / "no-val.jsonl")):
        with pytest.raises(FileNotFoundError, match="no file matches .*(nothing|no-val)"):
            local_files(str(train), None if val is None else str(val), tokenizer="gpt2", seq_len=8, batch_size=1)


def test_files_config_keys_are_arguments():
    config = load_data_config("files", ["train=x"])
    accepted = set(inspect.signature(local_files).parameters) | set(inspect.signature(TextDataModule).parameters)
    assert set(config) - {"_target_"} <= accepted


def test_prepare_data_accepts_every_data_config_name(tmp_path):
    for name in config_group_options("data"):
        assert load_data_config(name, []) is not None
    with pytest.raises(FileNotFoundError, match=r"--data 'enwik': no configs/data/enwik.yaml; data configs: \["):
        load_data_config("enwik", [])


def test_prepare_data_shards_local_files(corpus, shared_data, tmp_path):
    results = run(parse_args(
        ["--data", "files", "--out", str(tmp_path / "shards"), "--no-progress", "--override",
         f"train={corpus['train']}", f"val={corpus['val']}", "field=body",
         f"tokenizer={shared_data / 'gpt2_tokenizer'}"]
    ))  # fmt: skip
    assert results["train"]["documents"] == 16 and results["val"]["documents"] == 8
    assert TokenShards(tmp_path / "shards" / "train").index["vocab_size"] == 50257
    assert (tmp_path / "shards" / "tokenizer" / "tokenizer_config.json").is_file()


def test_klalm_prepare_data_is_an_installed_command():
    script = Path(sys.executable).parent / "klalm-prepare-data"
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "usage: klalm-prepare-data" in proc.stdout and "--data" in proc.stdout
