"""Every configs/data file composes and builds a working TextDataModule (fineweb_edu: built without network use)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from klalm.cli import prepare_data
from klalm.data import HFSource, TextDataModule, build_source

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "data"
OWN = ["python_docs", "enwiki_local", "fineweb_edu", "shards"]


def _compose(name: str, overrides: list[str] = ()):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def _check_batches(module: TextDataModule, seq_len: int, batch_size: int) -> None:
    batch = next(iter(module.train_dataloader()))
    assert batch["input_ids"].shape == (batch_size, seq_len) == batch["labels"].shape
    assert batch["input_ids"].max() < len(module.tokenizer)
    assert len(list(module.val_dataloader())) == module.val_batches


def test_python_docs_config_runs_offline(klalm_cache, monkeypatch):
    monkeypatch.setenv("KLALM_CACHE_DIR", str(klalm_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = _compose("python_docs", ["seq_len=32", "batch_size=2", "val_batches=2", "tokenizer.vocab_size=512"])
    module = instantiate(config)
    assert len(module.tokenizer) == 512 and module.tokenizer.eos_token_id is not None
    _check_batches(module, 32, 2)


def test_enwiki_local_config(shared_data, monkeypatch):
    monkeypatch.setenv("KLALM_SHARED_DATA", str(shared_data))
    config = _compose(
        "enwiki_local",
        [
            "seq_len=16",
            "batch_size=2",
            "num_workers=0",
            "val_batches=2",
            "+source.max_documents=3",
            "+val_source.max_documents=3",
        ],
    )
    module = instantiate(config)
    assert len(module.tokenizer) == 50257
    _check_batches(module, 16, 2)
    with pytest.raises(Exception, match="KLALM_SHARED_DATA"):  # hydra wraps the FileNotFoundError
        instantiate(config, data_root="/nonexistent/shared/data")


def test_shards_config_from_klalm_prepare_data(shared_data, tmp_path, monkeypatch):
    prepare_data(
        [
            "--data",
            "enwiki_local",
            "--out",
            str(tmp_path),
            "--max-documents",
            "4",
            "--no-progress",
            "--override",
            f"data_root={shared_data}",
        ]
    )
    monkeypatch.setenv("KLALM_SHARDS", str(tmp_path))
    module = instantiate(_compose("shards", ["seq_len=64", "batch_size=2", "num_workers=0", "val_batches=2"]))
    _check_batches(module, 64, 2)


def test_fineweb_edu_config_describes_the_hub_stream():
    config = _compose("fineweb_edu")
    source = build_source(dict(config.source))  # no network: datasets is only contacted when a stream starts
    assert isinstance(source, HFSource)
    assert (source.path, source.name, source.field) == ("HuggingFaceFW/fineweb-edu", "sample-10BT", "text")
    assert config.tokenizer.name_or_path == "gpt2" and config._target_ == "klalm.data.TextDataModule"


@pytest.mark.parametrize("name", OWN)
def test_config_keys_are_datamodule_arguments(name, monkeypatch):
    monkeypatch.setenv("KLALM_SHARED_DATA", "/tmp")
    config = _compose(name)
    import inspect

    accepted = set(inspect.signature(TextDataModule.__init__).parameters) - {"self"}
    assert set(config) - {"_target_"} <= accepted


@pytest.mark.parametrize("cuda", [False, True])
def test_batches_are_pinned_when_cuda_is_available(cuda, monkeypatch):
    """pin_memory=None (every config's default) pins exactly when CUDA is available; an explicit value is kept."""
    from klalm.data.loader import resolve_pin_memory
    from klalm.data.random_tokens import RandomTokenDataModule

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_pin_memory(None) is cuda and resolve_pin_memory(True) is True and resolve_pin_memory(False) is False
    module = RandomTokenDataModule(vocab_size=16, seq_len=4, batch_size=2)
    assert module.train_dataloader().pin_memory is cuda and module.val_dataloader().pin_memory is cuda
    assert RandomTokenDataModule(vocab_size=16, seq_len=4, batch_size=2, pin_memory=False).pin_memory is False
