"""scripts/train_tokenizer.py: a BPE from a data config (data=files included) or from files, and bad input refused
in one line."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("train_tokenizer", REPO / "scripts" / "train_tokenizer.py")
train_tokenizer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_tokenizer)


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A jsonl file of made-up words: enough distinct pairs for a few hundred merges."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(400)]
    lines = [json.dumps({"text": " ".join(rng.choice(words) for _ in range(50))}) for _ in range(60)]
    (path := tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_data_files_trains_on_the_files_it_names(corpus, tmp_path, capsys):
    """configs/data/files.yaml keeps its files under `train`, not `source`: the script failed on every such call."""
    train_tokenizer.main(["--data", "files", "--override", f"train={corpus}", "--vocab-size", "300",
                          "--out", str(tmp_path / "tok")])  # fmt: skip
    assert capsys.readouterr().out.startswith(f"saved {tmp_path / 'tok'}: vocab 300, ")


def test_sizes_that_cannot_work_are_refused_in_one_line(corpus, tmp_path, capsys):
    """--max-documents 0 trained on nothing and saved a 257-token tokenizer as if asked for it; --vocab-size 0 ended
    in a traceback."""
    argv = ["--files", str(corpus), "--vocab-size", "300", "--max-documents", "0", "--out", str(tmp_path / "tok")]
    with pytest.raises(SystemExit) as stop:
        train_tokenizer.main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("--max-documents must be > 0 (leave it out for every "
                                                             "document), got 0")  # fmt: skip
    with pytest.raises(SystemExit, match=r"^train_tokenizer: vocab_size must be > 256 \(the byte alphabet plus EOS\)"):
        train_tokenizer.main(["--files", str(corpus), "--vocab-size", "0", "--out", str(tmp_path / "tok")])
    assert not (tmp_path / "tok").exists()


@pytest.mark.parametrize("content", ["", '{"text": ""}\n'], ids=["empty-file", "only-bad-records"])
def test_a_corpus_without_a_document_is_refused_in_one_line(content, tmp_path):
    """An empty file (or one of bad records only) trained on nothing and saved a 257-token tokenizer, exit code 0."""
    (tmp_path / "empty.jsonl").write_text(content)
    with pytest.raises(SystemExit, match="^train_tokenizer: no document to train a BPE tokenizer on: the corpus is "):
        train_tokenizer.main(["--files", str(tmp_path / "empty.jsonl"), "--vocab-size", "300", "--out",
                              str(tmp_path / "tok")])  # fmt: skip
    assert not (tmp_path / "tok").exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (["--files", "/nonexistent/*.gz"], "no file matches '/nonexistent/*.gz'"),
        (["--data", "nope"], "--data 'nope': no configs/data/nope.yaml"),
        (["--data", "files"], "--data files: no training source; give the files with --override train="),
    ],
)
def test_a_missing_corpus_is_named_in_one_line(source, message, tmp_path):
    with pytest.raises(SystemExit) as stop:
        train_tokenizer.main([*source, "--vocab-size", "300", "--out", str(tmp_path / "tok")])
    assert isinstance(stop.value.code, str) and stop.value.code.startswith("train_tokenizer: ")
    assert message in stop.value.code and "\n" not in stop.value.code
    assert not (tmp_path / "tok").exists()
