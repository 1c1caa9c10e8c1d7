"""`klalm-prepare-data` refuses bad input with one line naming the flag, key or file, and writes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from klalm.cli.prepare_data_args import parse_args
from klalm.data.prepare import ShardWriter, prepare_dataset, run

REQUIRED = ["--data", "enwiki_local", "--out"]


EVERY_RECORD = "(leave it out for every record)"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--shard-tokens", "0"], "--shard-tokens must be > 0, got 0"),  # used to write empty shard files forever
        (["--shard-tokens", "-5"], "--shard-tokens must be > 0, got -5"),
        (["--max-documents", "-1"], f"--max-documents must be > 0 {EVERY_RECORD}, got -1"),  # wrote empty shards
        (["--max-documents", "0"], f"--max-documents must be > 0 {EVERY_RECORD}, got 0"),
    ],
)
def test_bad_flag_values_are_refused_by_the_parser(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        parse_args([*REQUIRED, str(tmp_path / "out"), *flags])
    assert err.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"klalm-prepare-data: error: {message}"


def test_help_and_usage_errors_answer_before_torch_is_imported(console_in_fresh_python):
    """The parser ran after klalm.data's imports of torch, transformers and Lightning: `--help` took 7.5 s."""
    heavy = ("torch", "transformers", "datasets", "lightning")
    for argv, status, stream in ((["--data", "files"], 2, "stderr"), (["--help"], 0, "stdout")):
        proc = console_in_fresh_python("prepare_data", "klalm-prepare-data", argv, heavy)
        assert getattr(proc, stream).startswith("usage: klalm-prepare-data"), proc.stderr[-2000:]
        assert proc.stdout.splitlines()[-2:] == [f"exit {status}", "heavy []"]
    assert "--override [OVERRIDE ...]" in proc.stdout and "KLALM_SHARDS=<out> klalm-train data=shards" in proc.stdout


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "out").write_text("")
    with pytest.raises(SystemExit):
        parse_args([*REQUIRED, str(tmp_path / "out")])
    assert capsys.readouterr().err.splitlines()[-1].endswith("is a file, not a folder")


def test_library_refuses_sizes_that_cannot_work_before_writing(tmp_path):
    with pytest.raises(ValueError, match="shard_tokens must be > 0, got 0"):
        ShardWriter(tmp_path / "w", "uint16", eos_id=0, shard_tokens=0)
    config = {"source": {"kind": "files", "paths": str(tmp_path)}, "tokenizer": {}}
    with pytest.raises(ValueError, match="max_documents must be > 0"):
        prepare_dataset(config, tmp_path / "d", splits=("train",), max_documents=0)
    with pytest.raises(ValueError, match="shard_tokens must be > 0"):
        prepare_dataset(config, tmp_path / "d", splits=("train",), shard_tokens=0)
    assert not (tmp_path / "w").exists() and not (tmp_path / "d").exists()


def _refused(argv: list[str], out: Path) -> str:
    """Runs the command, expecting one line of error and no --out folder; returns the line."""
    with pytest.raises(SystemExit) as err:
        run(parse_args([*argv, "--out", str(out), "--no-progress"]))
    message = err.value.code
    assert isinstance(message, str) and message.startswith("klalm-prepare-data: ") and "\n" not in message
    assert not out.exists()
    return message


def test_unknown_data_config_lists_the_available_ones(tmp_path):
    message = _refused(["--data", "enwiki_locl"], tmp_path / "out")
    assert "'enwiki_locl'" in message and "'enwiki_local', 'files'" in message


def test_unknown_override_key_is_named(tmp_path):
    message = _refused(["--data", "enwiki_local", "--override", "seq_lenn=5"], tmp_path / "out")
    assert "--override seq_lenn=5: data config 'enwiki_local' has no key 'seq_lenn'; its keys: [" in message
    message = _refused(["--data", "enwiki_local", "--override", "source.kindd=x"], tmp_path / "out")
    assert "'source' of data config 'enwiki_local' has no key 'kindd'" in message


def test_override_that_does_not_parse_is_named(tmp_path):
    assert "Error parsing override 'seq_len'" in _refused(["--data", "files", "--override", "seq_len"], tmp_path / "o")


def test_missing_shared_data_folder_names_it_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("KLALM_SHARED_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # no ../shared/data from here
    message = _refused(["--data", "enwiki_local"], tmp_path / "out")
    assert "data_root ../shared/data (" in message and "KLALM_SHARED_DATA" in message


def test_missing_data_files_are_named_before_anything_is_written(files_args, tmp_path):
    message = _refused([*files_args[:3], f"train={tmp_path / 'nope.jsonl'}", *files_args[4:]], tmp_path / "out")
    assert message.endswith(f"no file matches '{tmp_path / 'nope.jsonl'}'")
    message = _refused([*files_args, f"val={tmp_path / 'nope2.jsonl'}"], tmp_path / "out")  # train was written first
    assert message.endswith(f"no file matches '{tmp_path / 'nope2.jsonl'}'")


def test_split_without_a_source_is_refused_before_the_others_are_written(files_args, tmp_path):
    message = _refused(files_args, tmp_path / "out")  # no val=...: train used to be written, then a KeyError
    assert message.endswith(
        "split 'val' has no source: give it one with --override val=... (or prepare only --splits train)"
    )
    message = _refused([*files_args, "--splits", "val"], tmp_path / "out")  # named the key 'val_source', not 'val'
    assert message.endswith("split 'val' has no source: give it one with --override val=...")


def test_bad_config_values_are_named(files_args, tmp_path):
    assert _refused(["--data", "files"], tmp_path / "out").endswith(
        "train has no value; set it with --override train=..."
    )
    message = _refused([*files_args, "on_bad_record=foo"], tmp_path / "out")
    assert message.endswith("on_bad_record must be 'raise' or 'skip', got 'foo'")
    message = _refused([*files_args[:4], f"tokenizer={tmp_path / 'no_tokenizer'}"], tmp_path / "out")
    assert message.endswith(f"tokenizer folder {tmp_path / 'no_tokenizer'} does not exist")


def test_good_input_still_writes_shards(files_args, tmp_path):
    results = run(parse_args([*files_args, "--splits", "train", "--out", str(tmp_path / "out"), "--no-progress"]))
    assert results["train"]["documents"] == 1 and (tmp_path / "out" / "tokenizer").is_dir()


BAD_DATA = {  # file -> (content, what the refusal says besides the split)
    "late_corrupt.jsonl": (b'{"text": "a b"}\n' * 300 + b"{bad\n", "late_corrupt.jsonl:line 301: corrupt_json"),
    "binary.jsonl": (b"\xff\xfe\n", "binary.jsonl:line 1: invalid_utf8"),
    "wrongfield.jsonl": (b'{"body": "x"}\n', "wrongfield.jsonl:line 1: missing_field: no field 'text'"),
    "fake.jsonl.gz": (b'{"text": "not gzipped"}\n', "fake.jsonl.gz: Not a gzipped file"),
    "fake.jsonl.zst": (b'{"text": "not zstd"}\n', "fake.jsonl.zst: zstd decompress error"),  # was a traceback
    "empty.jsonl": (b"", "empty.jsonl'] field='text' (skipped: none)"),
}


def _files(folder: Path) -> dict[Path, bytes]:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", sorted(BAD_DATA))
def test_bad_data_is_refused_and_leaves_the_output_as_it_was(name, files_args, tmp_path):
    content, says = BAD_DATA[name]
    (tmp_path / name).write_bytes(content)
    bad = [*files_args[:3], f"train={tmp_path / name}", *files_args[4:], "--splits", "train", "--no-progress"]
    message = _refused(bad, tmp_path / "new")  # was a traceback (or exit 0 with 0 documents) and a train/ left behind
    assert message.startswith("klalm-prepare-data: --data files: split 'train': ") and says in message
    out = tmp_path / "out"
    run(parse_args([*files_args, "--splits", "train", "--out", str(out), "--no-progress"]))
    before = _files(out)
    with pytest.raises(SystemExit, match="split 'train': "):
        run(parse_args([*bad, "--out", str(out)]))
    assert _files(out) == before  # the rerun used to truncate tokens-00000.bin under the old index.json


def test_a_refused_run_removes_the_folders_it_made_above_a_new_out(files_args, tmp_path):
    """`--out new/deeper/out` refused for bad data removed out/ but left new/deeper/ behind."""
    (tmp_path / "empty.jsonl").write_text(json.dumps({"text": " "}) + "\n")
    bad = [*files_args[:3], f"train={tmp_path / 'empty.jsonl'}", *files_args[4:], "--splits", "train"]
    with pytest.raises(SystemExit, match="split 'train': bad record"):
        run(parse_args([*bad, "--out", str(tmp_path / "new" / "deeper" / "out"), "--no-progress"]))
    assert not (tmp_path / "new").exists()


def test_some_splits_beside_kept_ones_of_another_vocabulary_are_refused(files_args, tmp_path, shared_data):
    """`--splits train` into a folder whose val/ another tokenizer wrote replaced train/ and tokenizer/ and left a
    folder no run could read; now refused in one line, the folder as it was. Here the kept index is one written
    before indexes recorded the tokenizer's hash: its vocabulary size is compared."""
    out = tmp_path / "out"
    run(parse_args([*files_args, f"val={tmp_path / 'ok.jsonl'}", "--out", str(out), "--no-progress"]))
    index = out / "val" / "index.json"
    older = {k: v for k, v in json.loads(index.read_text()).items() if k != "tokenizer_sha256"}
    index.write_text(json.dumps({**older, "tokenizer": "other", "vocab_size": 4096}))  # as another tokenizer's
    before = _files(out)
    with pytest.raises(SystemExit) as err:
        run(parse_args([*files_args, "--splits", "train", "--out", str(out), "--no-progress"]))
    assert err.value.code.startswith(
        f"klalm-prepare-data: --data files: {out / 'val'} was tokenised with another tokenizer, other (vocab 4096), "
        f"than this one, {shared_data / 'gpt2_tokenizer'} (vocab 50257, sha256 "
    )
    assert _files(out) == before
    run(parse_args([*files_args, f"val={tmp_path / 'ok.jsonl'}", "--out", str(out), "--no-progress"]))  # all: fine


def test_some_splits_beside_kept_ones_of_another_tokenizer_of_the_same_size_are_refused(files_args, tmp_path):
    """Only the vocabulary sizes were compared: `--splits val` beside a train/ of another 300-token BPE passed, and
    the folder held splits of two tokenizers under the second one's tokenizer/."""
    from klalm.data.tokenizer import train_bpe_tokenizer

    for name, words in {"a": ("alpha", "beta"), "b": ("gamma", "delta")}.items():  # two corpora, two BPEs of 300
        corpus = [f"{words[0]}{i} {words[1]}{i * 7}" for i in range(500)]
        assert len(train_bpe_tokenizer(corpus, 300, tmp_path / name)) == 300
    out, train = tmp_path / "out", files_args[3]
    argv = ["--data", "files", "--override", train, f"val={tmp_path / 'ok.jsonl'}", "--out", str(out), "--no-progress"]
    run(parse_args([*argv[:5], f"tokenizer={tmp_path / 'a'}", *argv[5:]]))
    before = _files(out)
    with pytest.raises(SystemExit) as err:
        run(parse_args([*argv[:5], f"tokenizer={tmp_path / 'b'}", *argv[5:], "--splits", "val"]))
    message = err.value.code
    assert re.fullmatch(
        rf"klalm-prepare-data: --data files: {out / 'train'} was tokenised with another tokenizer, {tmp_path / 'a'} "
        rf"\(vocab 300, sha256 [0-9a-f]{{12}}\), than this one, {tmp_path / 'b'} \(vocab 300, sha256 [0-9a-f]{{12}}\): "
        r"write every split again \(leave out --splits\) or choose another --out",
        message,
    ), message
    assert _files(out) == before
    run(parse_args([*argv[:5], f"tokenizer={tmp_path / 'a'}", *argv[5:], "--splits", "val"]))  # the same one: fine


@pytest.mark.parametrize("content", [b"\xff\xfe\x00junk", b"not json", b"[]"])  # the first: a line naming no file
def test_a_kept_split_whose_index_is_not_one_is_named(content, files_args, tmp_path):
    out = tmp_path / "out"
    run(parse_args([*files_args, f"val={tmp_path / 'ok.jsonl'}", "--out", str(out), "--no-progress"]))
    (out / "val" / "index.json").write_bytes(content)
    before = _files(out)
    with pytest.raises(SystemExit) as err:
        run(parse_args([*files_args, "--splits", "train", "--out", str(out), "--no-progress"]))
    assert err.value.code.startswith(
        f"klalm-prepare-data: --data files: {out / 'val' / 'index.json'} is not a shard index"
    )
    assert _files(out) == before


def test_a_bad_records_hint_names_the_override_that_skips_it(files_args, tmp_path):
    """The hint named the Python argument, on_bad_record='skip', which the command does not take."""
    (tmp_path / "bad.jsonl").write_bytes(b'{"text": "a b"}\n{bad\n')
    bad = [*files_args[:3], f"train={tmp_path / 'bad.jsonl'}", *files_args[4:]]
    message = _refused([*bad, "--splits", "train"], tmp_path / "out")
    assert message.endswith("corrupt_json: Expecting property name enclosed in double quotes: line 1 column 2 (char 1) "
                            "(set --override on_bad_record=skip to skip and count such records)")  # fmt: skip
    run(parse_args([*bad, "on_bad_record=skip", "--splits", "train", "--out", str(tmp_path / "o"), "--no-progress"]))


def _interrupted(argv: list[str], capsys) -> str:
    """Runs the command, expecting Ctrl-C's end (exit status 130, one line on stderr); returns the line."""
    with pytest.raises(SystemExit) as err:
        try:
            run(parse_args(argv))
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C ended the command with a traceback")
    assert err.value.code == 130
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("klalm-prepare-data: interrupted; "), lines
    return lines[0]


def test_ctrl_c_ends_in_one_line_saying_what_the_output_holds(files_args, tmp_path, monkeypatch, capsys):
    """Ctrl-C printed a traceback and exit status 1."""
    from klalm.data import prepare

    out = tmp_path / "out"
    argv = [*files_args, f"val={tmp_path / 'ok.jsonl'}", "--out", str(out), "--no-progress"]

    def ctrl_c(self, tokens):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(prepare.ShardWriter, "add", ctrl_c)
        line = _interrupted(argv, capsys)
    assert line == f"klalm-prepare-data: interrupted; nothing written, {out} not created" and not out.exists()
    run(parse_args(argv))
    before = _files(out)
    capsys.readouterr()
    real_add, written = prepare.ShardWriter.add, 0

    def ctrl_c_in_val(self, tokens):  # as the val split is written, train/ staged already
        nonlocal written
        written += 1
        if written > 1:
            raise KeyboardInterrupt
        real_add(self, tokens)

    with monkeypatch.context() as patch:
        patch.setattr(prepare.ShardWriter, "add", ctrl_c_in_val)
        line = _interrupted(argv, capsys)
    assert written == 2 and line == f"klalm-prepare-data: interrupted; nothing written, {out} is as it was"
    assert _files(out) == before and sorted(p.name for p in out.iterdir()) == ["tokenizer", "train", "val"]
    real_swap_in = prepare._swap_in

    def swap_in_then_ctrl_c(staging, out_dir, names):  # Ctrl-C as the old splits are removed after the swap
        real_swap_in(staging, out_dir, names)
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "_swap_in", swap_in_then_ctrl_c)
    (tmp_path / "ok.jsonl").write_text('{"text": "new words"}\n')
    line = _interrupted(argv, capsys)
    assert line == f"klalm-prepare-data: interrupted; {out} holds the new splits already"
    assert _files(out) != before and sorted(p.name for p in out.iterdir()) == ["tokenizer", "train", "val"]


def test_what_no_earlier_run_wrote_is_refused_not_replaced(files_args, tmp_path):
    """`--out corpus` for a corpus in corpus/train/ and corpus/val/: the shards replaced both folders and the
    corpus went with the temporary folder, its files deleted; a folder or file named tokenizer too."""
    corpus = tmp_path / "corpus"
    for split in ("train", "val"):
        (corpus / split).mkdir(parents=True)
        (corpus / split / "part.jsonl").write_text('{"text": "hello world"}\n')
    before = _files(corpus)
    argv = ["--data", "files", "--override", f"train={corpus / 'train'}/*.jsonl", f"val={corpus / 'val'}/*.jsonl",
            *files_args[4:], "--out", str(corpus), "--no-progress"]  # fmt: skip
    with pytest.raises(SystemExit) as err:
        run(parse_args(argv))
    assert err.value.code == (
        f"klalm-prepare-data: --data files: {corpus / 'train'} is a folder holding 'part.jsonl', not only token "
        "shards: klalm-prepare-data replaces train/ in --out and would delete it; choose another --out (or move it "
        "away)"
    )
    assert _files(corpus) == before
    out = tmp_path / "out"
    (out / "tokenizer").mkdir(parents=True)
    (out / "tokenizer" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="tokenizer is a folder without tokenizer_config.json: "):
        run(parse_args([*files_args, "--splits", "train", "--out", str(out), "--no-progress"]))
    assert _files(out) == {Path("tokenizer/notes.txt"): b"mine"}
    (out / "tokenizer" / "notes.txt").unlink()
    (out / "tokenizer").rmdir()
    run(parse_args([*files_args, "--splits", "train", "--out", str(out), "--no-progress"]))
    run(parse_args([*files_args, "--splits", "train", "--out", str(out), "--no-progress"]))  # its own: replaced


def test_an_interrupted_swap_puts_the_old_folders_back(tmp_path, monkeypatch):
    from pathlib import Path

    from klalm.data import prepare

    staging, out = tmp_path / "staging", tmp_path / "out"
    for folder, text in ((staging, "new"), (out, "old")):
        for name in ("train", "val"):
            (folder / name).mkdir(parents=True)
            (folder / name / "f").write_text(text)
    (staging / "tokenizer").mkdir()  # new, with no old one: moved in first, and out again
    real_rename = Path.rename

    def rename(self, target):
        if self == staging / "val":  # the last move in fails (a full disk, Ctrl-C)
            raise KeyboardInterrupt
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        prepare._swap_in(staging, out, ["tokenizer", "train", "val"])
    assert {name: (out / name / "f").read_text() for name in ("train", "val")} == {"train": "old", "val": "old"}
    assert sorted(p.name for p in out.iterdir()) == ["train", "val"]


def test_a_key_the_data_module_does_not_take_is_named_in_one_line(files_args, tmp_path):
    """`--override +foo=1` passes composition (it adds a key) and failed in the data module's constructor with
    Hydra's traceback."""
    message = _refused([*files_args, "+foo=1"], tmp_path / "out")
    assert "unexpected keyword argument 'foo'" in message


def test_token_shards_as_the_source_are_refused_before_anything_is_written(shared_data, tmp_path, monkeypatch):
    """`--data shards` is a configs/data name, but its sources are shards already: it failed with AttributeError
    (and with --max-documents, TypeError)."""
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "tokenizer").symlink_to(shared_data / "gpt2_tokenizer")
    monkeypatch.setenv("KLALM_SHARDS", str(tmp_path / "shards"))
    for extra in ([], ["--max-documents", "3"]):
        message = _refused(["--data", "shards", *extra], tmp_path / "out")
        assert f"split 'train' reads token shards ({tmp_path / 'shards'}/train), which are prepared already" in message


def test_an_out_under_a_folder_that_cannot_be_read_is_refused_in_one_line(tmp_path, monkeypatch):
    """`--out`'s state was read before any check: a PermissionError traceback. (Path.exists is patched: root, as
    tests may run, reads any folder.)"""
    locked, exists = tmp_path / "locked", Path.exists

    def exists_or_denied(path, *args, **kwargs):
        if locked in path.parents:
            raise PermissionError(13, "Permission denied", str(path))
        return exists(path, *args, **kwargs)

    args = parse_args([*REQUIRED, str(locked / "out")])
    monkeypatch.setattr(Path, "exists", exists_or_denied)
    with pytest.raises(SystemExit, match=r"^klalm-prepare-data: --out .*locked/out: .*Permission denied") as err:
        run(args)
    assert "\n" not in str(err.value.code)
