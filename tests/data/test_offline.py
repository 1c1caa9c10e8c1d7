"""The offline corpus (Python docs), the tokenizer paths (trained BPE, HF folder, HF `datasets` streaming) and the
refusal, at once, of what needs a Hugging Face hub that cannot be reached (`klalm.data.hub`)."""

from __future__ import annotations

import json
import os
import socket
from types import SimpleNamespace

import datasets
import datasets.config
import pytest
import torch
from huggingface_hub import constants as hf_constants

from klalm.data import PackedTextDataset, ResumableLoader, build_source, load_tokenizer, train_bpe_tokenizer
from klalm.data import tokenizer as tokenizer_module
from klalm.data.hub import HubUnreachableError, check_hub, hub_unreachable
from klalm.data.python_docs import python_docs_corpus
from klalm.data.tokenizer import decode_tokens, encode_texts
from klalm.errors import one_line

from .conftest import oracle_windows, read_texts


@pytest.fixture
def cache_dir(klalm_cache):
    return klalm_cache


def test_python_docs_corpus_is_deterministic_with_a_disjoint_val_split(cache_dir):
    train = python_docs_corpus(cache_dir, "train")
    val = python_docs_corpus(cache_dir, "val")
    assert len(train) > 400 and len(val) > 10
    assert {d["id"] for d in train}.isdisjoint(d["id"] for d in val)
    assert train[0]["id"].startswith("topic:") and any(d["id"] == "module:json" for d in train + val)
    assert sum(len(d["text"]) for d in train + val) > 1_500_000  # characters
    assert python_docs_corpus(cache_dir, "train") == train  # read back from the cache
    with pytest.raises(ValueError, match="split"):
        python_docs_corpus(cache_dir, "test")


def test_trained_bpe_round_trips_and_is_cached(cache_dir, tmp_path):
    texts = [d["text"] for d in python_docs_corpus(cache_dir, "train")[:60]]
    tokenizer = train_bpe_tokenizer(texts, 512, tmp_path / "bpe")
    assert len(tokenizer) == 512 and tokenizer.eos_token == "<|endoftext|>"
    sample = "def f(x):\n    return x ** 2  # ünïcode ✓\n"
    ids = encode_texts(tokenizer, [sample])[0]
    assert decode_tokens(tokenizer, ids) == sample and max(ids) < 512
    config = {
        "kind": "trained_bpe",
        "vocab_size": 300,
        "cache_dir": str(cache_dir),
        "source": {"kind": "python_docs", "split": "train", "cache_dir": str(cache_dir), "max_documents": 20},
    }
    first = load_tokenizer(config)
    second = load_tokenizer(config)  # from the cache folder
    assert len(first) == 300 and first.get_vocab() == second.get_vocab()
    assert len(list(cache_dir.glob("bpe-300-*"))) == 1


def test_trained_bpe_cache_follows_the_corpus_files(tmp_path):
    """An edited corpus file trains a new BPE (the cache key has each file's size and mtime); none is trained on an
    empty corpus."""
    corpus = tmp_path / "corpus.jsonl"
    config = {
        "kind": "trained_bpe",
        "vocab_size": 300,
        "cache_dir": str(tmp_path / "cache"),
        "source": {"kind": "files", "paths": str(corpus)},
    }

    def write(words: list[str]) -> None:
        corpus.write_text("".join(json.dumps({"text": " ".join(words * 20)}) + "\n" for _ in range(5)))

    write(["alpha", "beta", "gamma"])
    first = load_tokenizer(config)
    assert load_tokenizer(config).get_vocab() == first.get_vocab()  # unchanged file: from the cache
    write(["delta", "epsilon", "zeta"])
    os.utime(corpus, ns=(1, 1))  # a different mtime even on a coarse-clock file system
    second = load_tokenizer(config)
    assert "Ġdelta" in second.get_vocab() and "Ġdelta" not in first.get_vocab()
    assert len(list((tmp_path / "cache").glob("bpe-300-*"))) == 2
    corpus.write_text("")
    with pytest.raises(ValueError, match="no usable document") as err:
        load_tokenizer(config)
    assert str(corpus) in str(err.value) and "\n" not in str(err.value)
    assert len(list((tmp_path / "cache").iterdir())) == 2  # nothing cached for the empty corpus


def test_python_docs_batches_use_the_whole_vocab_range(cache_dir):
    tokenizer = load_tokenizer(
        {
            "kind": "trained_bpe",
            "vocab_size": 300,
            "cache_dir": str(cache_dir),
            "source": {"kind": "python_docs", "cache_dir": str(cache_dir), "max_documents": 20},
        }
    )
    source = build_source({"kind": "python_docs", "split": "val", "cache_dir": str(cache_dir)})
    batch = next(iter(PackedTextDataset(source, tokenizer, seq_len=64, batch_size=2)))
    assert batch["input_ids"].shape == (2, 64) and batch["input_ids"].max() < len(tokenizer)


@pytest.fixture
def hub(monkeypatch):
    """The hub as `klalm.data.hub` sees it, without a real lookup: no proxy, no offline mode, huggingface.co, and
    `hub.resolves` (default False) decides what `socket.getaddrinfo` answers; `hub.lookups` lists the names asked."""
    state = SimpleNamespace(resolves=False, lookups=[])

    def getaddrinfo(host, *args, **kwargs):
        state.lookups.append(host)
        if not state.resolves:
            raise socket.gaierror(-2, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", 443))]

    for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(hf_constants, "ENDPOINT", "https://huggingface.co")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return state


def _go_offline(monkeypatch, how: str) -> str:
    """Sets offline mode `how` (the hub fixture's failing lookup is the "dns" case); returns the reason it gives."""
    if how in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(how, "1")  # for a spawned process; this one read the variables when the libraries loaded
        monkeypatch.setattr(hf_constants if how == "HF_HUB_OFFLINE" else datasets.config, how, True)
        return f"{how} is set"
    return "huggingface.co does not resolve: Name or service not known"


def test_tokenizer_config_errors(tmp_path, monkeypatch, hub):
    with pytest.raises(KeyError, match="valid kinds"):
        load_tokenizer({"kind": "sentencepiece"})
    with pytest.raises(KeyError, match="kind"):
        load_tokenizer({"name_or_path": "gpt2"})
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        load_tokenizer({"kind": "hf", "name_or_path": str(tmp_path / "does-not-exist")})
    empty = tmp_path / "empty"  # was transformers' "Couldn't instantiate the backend tokenizer from one of:"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=rf"^no usable tokenizer in folder {empty} \(no tokenizer.json, nor"):
        load_tokenizer({"kind": "hf", "name_or_path": str(empty)})
    with pytest.raises(ValueError, match=r"^tokenizer must be a mapping with a 'kind' key.*; got 'foo'$"):
        load_tokenizer("foo")  # data.tokenizer=foo where the data config holds a mapping: was "dictionary update ..."
    calls = []

    def offline(name, **kwargs):  # AutoTokenizer.from_pretrained without the tokenizer cached and without network
        calls.append(kwargs)
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")

    hub.resolves = True  # the host resolves, the download fails anyway
    monkeypatch.setattr(tokenizer_module.AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(FileNotFoundError, match="'gpt2' is not a local folder.*data.tokenizer=bpe") as err:
        load_tokenizer({"kind": "hf", "name_or_path": "gpt2"})
    assert "\n" not in str(err.value) and calls == [{"local_files_only": True}, {}]  # the cache first, then the hub
    assert "(We couldn't connect to 'https://huggingface.co' to load the files.)" in str(err.value)


@pytest.mark.parametrize("how", ["dns", "HF_HUB_OFFLINE"])
def test_an_unreachable_hub_refuses_a_hub_tokenizer_before_the_download(monkeypatch, hub, how):
    """The cache is still tried; the download (huggingface_hub's ~50 s of retries offline) is not."""
    reason = _go_offline(monkeypatch, how)
    calls = []

    def not_cached(name, **kwargs):
        calls.append(kwargs)
        if not kwargs.get("local_files_only"):
            raise AssertionError("the hub was asked although it cannot be reached")
        raise OSError("not in the cache")

    monkeypatch.setattr(tokenizer_module.AutoTokenizer, "from_pretrained", not_cached)
    with pytest.raises(FileNotFoundError) as err:
        load_tokenizer({"kind": "hf", "name_or_path": "gpt2"})
    assert str(err.value) == (
        f"tokenizer 'gpt2' is not a local folder, not in the Hugging Face cache and not available from the hub "
        f"({reason}): name a local tokenizer folder (with data=files, data.tokenizer=bpe trains one)"
    )
    assert calls == [{"local_files_only": True}]


def _fineweb() -> dict:
    return {"kind": "hf", "path": "HuggingFaceFW/fineweb-edu", "name": "sample-10BT", "split": "train"}


@pytest.mark.parametrize("how", ["dns", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_an_unreachable_hub_refuses_a_hub_dataset_before_streaming(monkeypatch, hub, how):
    reason = _go_offline(monkeypatch, how)

    def no_load(*args, **kwargs):
        raise AssertionError("datasets.load_dataset was called although the hub cannot be reached")

    monkeypatch.setattr(datasets, "load_dataset", no_load)
    source = build_source(_fineweb())  # building it asks nothing: only a stream needs the hub
    with pytest.raises(HubUnreachableError) as err:
        source.stream(0, 1)
    assert isinstance(err.value, FileNotFoundError)  # what klalm-train and klalm-prepare-data refuse on one line
    assert str(err.value) == (
        f"streaming the hub dataset 'HuggingFaceFW/fineweb-edu' needs the Hugging Face hub, which cannot be reached "
        f"({reason}): use local files (data=files, or kind: hf with a local builder such as json and data_files)"
    )
    with pytest.raises(HubUnreachableError, match="^streaming the hub dataset 'hf://datasets/org/name' needs"):
        build_source({**_fineweb(), "path": "hf://datasets/org/name"}).stream(0, 1)  # the hub's own URL form


def test_a_dataloader_worker_refusal_reads_as_one_line(monkeypatch, hub, gpt2):
    """In a worker the refusal comes back as the same error type, whose one line is the refusal itself."""
    reason = _go_offline(monkeypatch, "HF_HUB_OFFLINE")  # set in the environment too: holds in a spawned worker
    dataset = PackedTextDataset(build_source(_fineweb()), gpt2, seq_len=63, batch_size=1)
    with pytest.raises(FileNotFoundError) as err:
        next(iter(ResumableLoader(dataset, batch_size=None, num_workers=1)))
    assert one_line(err.value).startswith("streaming the hub dataset 'HuggingFaceFW/fineweb-edu' needs the Hugging")
    assert reason in one_line(err.value)


def test_local_builders_and_folders_are_not_looked_up(tmp_path, hub):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "a local document"}) + "\n")
    for config in ({"path": "json", "data_files": str(tmp_path / "a.jsonl")}, {"path": str(tmp_path)}):
        records = list(build_source({"kind": "hf", **config}).stream(0, 1))
        assert [r.text for r in records] == ["a local document"]
    assert "huggingface.co" not in hub.lookups  # (a library may look other names up: s3.amazonaws.com)


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"])
def test_a_proxy_leaves_the_hub_to_the_libraries(monkeypatch, hub, variable):
    """Behind a proxy the proxy resolves the hub's name: a local lookup that fails says nothing, so none is made
    (unless NO_PROXY names the hub's host)."""
    monkeypatch.setenv(variable, "http://proxy.example:3128")
    check_hub("this test", "nothing", streaming=True)
    assert hub.lookups == []
    monkeypatch.setenv("NO_PROXY", "huggingface.co")
    with pytest.raises(HubUnreachableError, match="huggingface.co does not resolve"):
        check_hub("this test", "nothing")
    monkeypatch.delenv("NO_PROXY")
    _go_offline(monkeypatch, "HF_HUB_OFFLINE")  # an offline mode still counts
    with pytest.raises(HubUnreachableError, match=r"^this test needs .*\(HF_HUB_OFFLINE is set\): nothing$"):
        check_hub("this test", "nothing")


def test_what_datasets_may_take_from_its_cache_is_refused_only_when_the_host_does_not_resolve(monkeypatch, hub):
    """lm-eval's task datasets load from the `datasets` cache in offline mode: a mode set is left to it."""
    assert hub_unreachable(from_cache=True) == "huggingface.co does not resolve: Name or service not known"
    hub.resolves = True
    assert hub_unreachable(from_cache=True) is None and hub.lookups == ["huggingface.co"] * 2
    hub.resolves = False
    for how in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setattr(hf_constants if how == "HF_HUB_OFFLINE" else datasets.config, how, True)
        assert hub_unreachable(from_cache=True) is None and hub_unreachable() is not None
    assert hub.lookups == ["huggingface.co"] * 2


def test_gpt2_from_the_local_folder(gpt2):
    assert len(gpt2) == 50257 and gpt2.eos_token_id == 50256
    assert encode_texts(gpt2, ["Hello world"]) == [[15496, 995]]


def test_hf_streaming_source_partitions_and_resumes(enwiki, gpt2, monkeypatch):
    """The `hf` source through `datasets` streaming, with the local `json` builder (no network)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    file = enwiki / "enwiki-00009-of-00010.jsonl.gz"
    config = {"kind": "hf", "path": "json", "data_files": str(file), "split": "train", "max_documents": 8}
    source = build_source(config)
    texts = read_texts([file], 8)
    shares = [[r.text for r in source.stream(c, 2) if r.problem is None] for c in range(2)]
    assert sorted(shares[0] + shares[1], key=texts.index) == [t for t in texts if t is not None]
    stream = source.stream(1, 2)
    iterator = iter(stream)
    next(iterator)
    state = json.loads(json.dumps(stream.state_dict()))
    assert [r.text for r in source.stream(1, 2, state)] == [r.text for r in iterator]
    dataset = PackedTextDataset(source, gpt2, seq_len=63, batch_size=1, loop=False, on_bad_record="skip")
    windows = [
        tuple(torch.cat([b["input_ids"][0], b["labels"][0, -1:]]).tolist())
        for b in ResumableLoader(dataset, batch_size=None, num_workers=2)
    ]
    # datasets assigns examples to the 2 consumers by its own rule; compare as multisets against the oracle
    oracle = [w for share in shares for w in oracle_windows(gpt2, [t for t in texts if t in share], 0, 1, 64)]
    assert sorted(windows) == sorted(oracle)


def test_hf_source_packed_stream_resumes_exactly(enwiki, gpt2, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    config = {
        "kind": "hf",
        "path": "json",
        "data_files": str(enwiki / "enwiki-00009-of-00010.jsonl.gz"),
        "max_documents": 6,
    }

    def loader():
        dataset = PackedTextDataset(
            build_source(config), gpt2, seq_len=255, batch_size=4, block_docs=2, shuffle=True, on_bad_record="skip"
        )
        return ResumableLoader(dataset, batch_size=None)

    first = loader()
    iterator = iter(first)
    [next(iterator) for _ in range(10)]
    state = json.loads(json.dumps(first.state_dict()))  # plain data only
    expected = [next(iterator)["input_ids"] for _ in range(6)]  # crosses into the second epoch (~14 per epoch)
    resumed = loader()
    resumed.load_state_dict(state)
    again = iter(resumed)
    assert all(torch.equal(a, next(again)["input_ids"]) for a in expected)


@pytest.mark.parametrize(("files", "consumers"), [(3, 2), (3, 3), (2, 4), (1, 3)])
def test_hf_source_partitions_by_file_or_by_example(tmp_path, monkeypatch, files, consumers):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    docs = [f"document number {i}" for i in range(9)]
    parts = [docs[f::files] for f in range(files)]
    for f, part in enumerate(parts):
        (tmp_path / f"part{f}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in part))
    source = build_source({"kind": "hf", "path": "json", "data_files": sorted(map(str, tmp_path.glob("*.jsonl")))})
    shares = [[r.text for r in source.stream(c, consumers)] for c in range(consumers)]
    assert sorted(t for share in shares for t in share) == sorted(docs) and all(shares)  # no overlap, no loss
    if files >= consumers:  # whole files, in contiguous groups
        assert all(any(share[: len(p)] == p for p in parts) for share in shares)
    else:  # every N-th example of the whole stream
        stream = [d for part in parts for d in part]
        assert shares == [stream[c::consumers] for c in range(consumers)]
