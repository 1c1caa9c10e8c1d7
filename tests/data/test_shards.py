"""Pre-tokenised shards: they decode back to the source text; the shard loader partitions and resumes exactly."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

from klalm.data import (
    DataFileError,
    ResumableLoader,
    ShardDataset,
    ShardSource,
    TextDataModule,
    TokenShards,
    prepare_shards,
)
from klalm.data.loader import NoDocumentsError
from klalm.data.tokenizer import decode_tokens, train_bpe_tokenizer

from .conftest import read_texts

DOCS = 12


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory, enwiki, gpt2_config):
    out = tmp_path_factory.mktemp("shards")
    source = {"kind": "files", "paths": str(enwiki / "enwiki-00009-*.jsonl.gz"), "max_documents": DOCS}
    # tiny shard files so that documents and windows straddle file boundaries
    prepare_shards(source, gpt2_config, out, shard_tokens=20_000, on_bad_record="skip", progress=False)
    return out


def test_validation_shards_shorter_than_a_batch_per_consumer_are_refused_before_fitting(shard_dir, gpt2_config):
    """Found at the first validation, which the CPU trainer config (no sanity validation) reaches after
    train.val_every_n_steps steps; the index's token count tells at once."""
    windows = len(TokenShards(shard_dir)) // 1024
    source = {"kind": "shards", "path": str(shard_dir)}
    for workers, consumers in ((0, 1), (2, 2)):
        batch = windows // consumers + 1
        module = TextDataModule(source, gpt2_config, 1023, 1, workers, val_source=source, val_batch_size=batch)
        with pytest.raises(NoDocumentsError) as err:
            module.setup("fit")
        assert str(err.value) == (
            f"validation source shards {shard_dir} ({len(TokenShards(shard_dir))} tokens): {windows} windows of 1024 "
            f"tokens leave some of its {consumers} consumers (ranks x loader workers) {batch - 1}, fewer than one "
            f"batch of {batch}"
        )
    TextDataModule(source, gpt2_config, 1023, 1, 2, val_source=source, val_batch_size=windows // 2).setup("fit")


def test_a_run_on_shards_hashes_its_tokenizer_once(shard_dir, gpt2_config, monkeypatch):
    """The training and the validation shards' tokenizer checks each hashed the whole GPT-2 tokenizer (about half a
    second each at a run's start)."""
    from klalm.data import tokenizer

    hashed = []
    real = tokenizer.tokenizer_sha256
    monkeypatch.setattr(tokenizer, "tokenizer_sha256", lambda tok: hashed.append(id(tok)) or real(tok))
    source = {"kind": "shards", "path": str(shard_dir)}
    module = TextDataModule(source, gpt2_config, 8, 1, val_source=source, val_batches=1)
    module.train_dataloader(), module.val_dataloader(), module.val_dataloader()
    assert hashed == [id(module.tokenizer)]


def test_prepared_shards_decode_back_to_the_source_text(shard_dir, enwiki, gpt2):
    index = json.loads((shard_dir / "index.json").read_text())
    assert index["dtype"] == "uint16" and index["skipped"] == {"empty_document": 1} and len(index["shards"]) > 2
    shards = TokenShards(shard_dir)
    tokens = shards.read(0, len(shards))
    assert tokens[-1] == gpt2.eos_token_id and len(shards) == index["total_tokens"]
    documents = np.split(tokens, np.flatnonzero(tokens == gpt2.eos_token_id) + 1)[:-1]
    decoded = [decode_tokens(gpt2, d[:-1].tolist()) for d in documents]
    expected = [t for t in read_texts([enwiki / "enwiki-00009-of-00010.jsonl.gz"], DOCS) if t is not None]
    assert decoded == expected and index["documents"] == len(expected)


def test_shard_reader_errors(tmp_path, shard_dir):
    with pytest.raises(FileNotFoundError, match="index.json"):
        TokenShards(tmp_path)
    shards = TokenShards(shard_dir)
    with pytest.raises(IndexError):
        shards.read(len(shards) - 2, 5)


@pytest.mark.parametrize("damage", ["truncated", "empty", "odd", "not-json", "no-key"])
def test_a_damaged_shard_folder_is_a_data_file_error_naming_the_file(tmp_path, shard_dir, damage):
    """A shard file cut short or an index that is no JSON raised ValueError or JSONDecodeError (naming no file), an
    index without a key KeyError, an empty or odd-sized shard file numpy's ValueError: klalm-train's traceback."""
    folder = tmp_path / "shards"
    shutil.copytree(shard_dir, folder)
    shard, index = folder / "tokens-00000.bin", folder / "index.json"
    bad = {"truncated": shard, "empty": shard, "odd": shard, "not-json": index, "no-key": index}[damage]
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "empty":
        shard.write_bytes(b"")
    elif damage == "odd":
        shard.write_bytes(shard.read_bytes() + b"x")
    elif damage == "not-json":
        index.write_text(index.read_text()[:20])
    else:
        index.write_text(json.dumps({k: v for k, v in json.loads(index.read_text()).items() if k != "dtype"}))
    with pytest.raises(DataFileError, match=f"^{re.escape(str(bad))}.*; prepare the folder again with klalm-prepare"):
        TokenShards(folder)


@pytest.fixture(scope="module")
def bpes(tmp_path_factory) -> dict:
    """Configs of two 300-token BPEs trained on two corpora (their text files beside them): one vocabulary size,
    other tokens."""
    folder = tmp_path_factory.mktemp("bpes")
    configs = {}
    for name, words in {"a": ("alpha", "beta"), "b": ("gamma", "delta")}.items():
        corpus = [f"{words[0]}{i} {words[1]}{i * 7}" for i in range(500)]
        train_bpe_tokenizer(corpus, 300, folder / name)
        (folder / f"{name}.txt").write_text(" ".join(corpus))
        configs[name] = {"kind": "hf", "name_or_path": str(folder / name)}
    return configs


def test_too_few_windows_or_another_vocabulary_are_refused_as_user_errors(shard_dir, gpt2_config, bpes):
    """Both were plain ValueErrors, which klalm-train reported with Hydra's traceback, leaving the run folder."""
    from klalm.config_checks import ConfigError
    from klalm.data.loader import NoDocumentsError

    source = ShardSource(str(shard_dir))
    dataset = ShardDataset(source=source, seq_len=len(source.shards), batch_size=2, shuffle=False, loop=False)
    with pytest.raises(NoDocumentsError, match="gets 0 windows of .* fewer than one batch of 2"):
        next(iter(dataset))
    with pytest.raises(
        ConfigError, match=r"were tokenised with another tokenizer, .* \(vocab 50257, sha256 .*\), than"
    ):
        _shard_loader(shard_dir, bpes["a"])


def _shard_loader(folder, tokenizer_config):
    """The training loader of a data module reading the shards in `folder` with the tokenizer of `tokenizer_config`."""
    return TextDataModule({"kind": "shards", "path": str(folder)}, tokenizer_config, 8, 1).train_dataloader()


@pytest.mark.parametrize("index", ["hashed", "older"])
def test_shards_of_another_tokenizer_of_the_same_size_are_refused_by_hash(tmp_path, bpes, index):
    """Only the vocabulary sizes were compared: a run trained on shards of another 300-token BPE, every id another
    token. An index written before the hash was recorded is still compared by vocabulary size."""
    from klalm.config_checks import ConfigError

    folder, (tok_a, tok_b) = tmp_path / "shards", (bpes[name]["name_or_path"] for name in "ab")
    prepare_shards({"kind": "files", "paths": f"{tok_a}.txt"}, bpes["a"], folder, progress=False)
    if index == "older":
        older = {k: v for k, v in json.loads((folder / "index.json").read_text()).items() if k != "tokenizer_sha256"}
        (folder / "index.json").write_text(json.dumps(older))
    _shard_loader(folder, bpes["a"])  # its own: fine
    if index == "older":
        _shard_loader(folder, bpes["b"])  # as before
        return
    with pytest.raises(ConfigError) as err:
        _shard_loader(folder, bpes["b"])
    assert re.fullmatch(
        rf"shards {folder} were tokenised with another tokenizer, {tok_a} \(vocab 300, sha256 [0-9a-f]{{12}}\), than "
        rf"the tokenizer config's, {tok_b} \(vocab 300, sha256 [0-9a-f]{{12}}\): train with the tokenizer they were "
        r"prepared with \(the tokenizer/ folder klalm-prepare-data wrote beside them\) or prepare them again",
        str(err.value),
    ), err.value


def _windows(dataset_kwargs, rank, world, workers):
    dataset = ShardDataset(**dataset_kwargs, rank=rank, world_size=world)
    out = []
    for batch in ResumableLoader(dataset, batch_size=None, num_workers=workers):
        out += [tuple(torch.cat([x, y[-1:]]).tolist()) for x, y in zip(batch["input_ids"], batch["labels"])]
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_shard_windows_partition_the_stream(shard_dir, shuffle):
    source, seq_len = ShardSource(str(shard_dir)), 127
    kwargs = dict(source=source, seq_len=seq_len, batch_size=1, shuffle=shuffle, loop=False)
    got = sorted(w for rank in range(2) for w in _windows(kwargs, rank, 2, 2))
    tokens = source.shards.read(0, len(source.shards))
    width = seq_len + 1
    expected = sorted(tuple(tokens[k : k + width].tolist()) for k in range(0, len(tokens) - width + 1, width))
    assert got == expected


def _dataset_states(state: dict) -> list[dict]:
    if "_snapshot" not in state:
        return [state["dataset_state"]]
    return [w["dataset_state"] for w in state["_snapshot"]["_worker_snapshots"].values()]


@pytest.mark.parametrize("workers", [0, 2])
def test_shard_loader_resumes_exactly(shard_dir, workers):
    def loader():
        dataset = ShardDataset(ShardSource(str(shard_dir)), seq_len=255, batch_size=4, shuffle=True, seed=1)
        return ResumableLoader(dataset, batch_size=None, num_workers=workers)

    first = loader()
    iterator = iter(first)
    [next(iterator) for _ in range(70)]  # ~58 batches of 1024 tokens per epoch: crosses into the second epoch
    state = first.state_dict()
    epochs = [s["epoch"] for s in _dataset_states(state)]
    assert max(epochs) == 1
    expected = [next(iterator)["input_ids"] for _ in range(5)]
    resumed = loader()
    resumed.load_state_dict(state)
    again = iter(resumed)
    assert all(torch.equal(a, next(again)["input_ids"]) for a in expected)


def test_the_tokenizer_hash_ignores_truncation_and_padding(gpt2_config):
    """`tokenizer_sha256` hashed the backend's truncation and padding settings, which a call such as
    `tok(text, truncation=True, max_length=16)` changes."""
    from klalm.data.tokenizer import load_tokenizer, tokenizer_sha256

    tok = load_tokenizer(gpt2_config)  # not the session's: the call below changes its backend
    before = tokenizer_sha256(tok)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok(["a short text", "another"], truncation=True, max_length=16, padding="max_length")
    assert tok.backend_tokenizer.truncation is not None  # (the settings did change)
    assert tokenizer_sha256(tok) == before
