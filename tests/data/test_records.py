"""Local file formats and the robustness cases: clear errors naming file/line/field, or counted skips."""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from klalm.data import BadRecordError, PackedTextDataset, build_source
from klalm.data.loader import NoDocumentsError
from klalm.data.records import BadRecordPolicy, DataFileError, expand_paths

DOCS = ["first document, with some words", "second document\nspans lines", "third: ünïcödé ✓"]


def _jsonl_bytes(rows: list) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


WRITERS = {
    "a.jsonl": lambda p: p.write_bytes(_jsonl_bytes([{"text": d} for d in DOCS])),
    "a.jsonl.gz": lambda p: p.write_bytes(gzip.compress(_jsonl_bytes([{"text": d} for d in DOCS]))),
    "a.jsonl.bz2": lambda p: p.write_bytes(bz2.compress(_jsonl_bytes([{"text": d} for d in DOCS]))),
    "a.jsonl.zst": lambda p: p.write_bytes(
        zstandard.ZstdCompressor().compress(_jsonl_bytes([{"text": d} for d in DOCS]))
    ),
    "a.json": lambda p: p.write_text(json.dumps([{"text": d} for d in DOCS])),
    "a.parquet": lambda p: pq.write_table(pa.table({"text": DOCS, "n": [1, 2, 3]}), p),
}


def _texts(source_config: dict, consumer: int = 0, n: int = 1) -> list:
    return [r.text for r in build_source(source_config).stream(consumer, n)]


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_formats_read_the_same_documents(tmp_path: Path, name: str):
    WRITERS[name](tmp_path / name)
    assert _texts({"kind": "files", "paths": str(tmp_path / name)}) == DOCS


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.json", "a.txt"])
def test_a_byte_order_mark_at_the_start_of_a_file_is_no_part_of_its_text(tmp_path: Path, name: str):
    """Windows tools start UTF-8 files with a BOM: a jsonl file's first record was corrupt_json, a json file refused,
    a txt file's document began with U+FEFF."""
    rows = [{"text": d} for d in DOCS]
    content = {".jsonl": _jsonl_bytes(rows), ".json": json.dumps(rows).encode(), ".txt": DOCS[2].encode()}
    payload = b"\xef\xbb\xbf" + content[Path(name.removesuffix(".gz")).suffix]
    (tmp_path / name).write_bytes(gzip.compress(payload) if name.endswith(".gz") else payload)
    assert _texts({"kind": "files", "paths": str(tmp_path / name)}) == (DOCS[2:] if name == "a.txt" else DOCS)


def test_txt_files_are_one_document_each_in_sorted_order(tmp_path: Path):
    for i, doc in enumerate(DOCS):
        (tmp_path / f"{i}.txt").write_text(doc)
    assert _texts({"kind": "files", "paths": str(tmp_path / "*.txt")}) == DOCS


def test_consumers_split_records_and_resume(tmp_path: Path):
    rows = [{"text": f"doc {i}"} for i in range(10)]
    (tmp_path / "a.jsonl").write_bytes(_jsonl_bytes(rows[:4]))
    (tmp_path / "b.jsonl").write_bytes(_jsonl_bytes(rows[4:]))
    source = build_source({"kind": "files", "paths": [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]})
    shares = [[r.text for r in source.stream(c, 3)] for c in range(3)]
    assert shares == [[f"doc {i}" for i in range(c, 10, 3)] for c in range(3)]
    stream = source.stream(1, 3)
    it = iter(stream)
    assert next(it).text == "doc 1" and next(it).text == "doc 4"
    assert [r.text for r in source.stream(1, 3, stream.state_dict())] == ["doc 7"]


BAD_CASES = {
    "corrupt_json": (b'{"text": "ok"}\n{"text": "broken\n', "corrupt_json", ":line 2"),
    "empty_document": (b'{"text": "ok"}\n{"text": "   "}\n', "empty_document", ":line 2"),
    "invalid_utf8": (b'{"text": "ok"}\n{"text": "\xff\xfe bad"}\n', "invalid_utf8", ":line 2"),
    "wrong_field": (b'{"text": "ok"}\n{"body": "no text field"}\n', "missing_field", "'text'"),
    "not_text": (b'{"text": "ok"}\n{"text": 17}\n', "not_text", ":line 2"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_record_raises_naming_file_and_line(tmp_path: Path, case: str):
    payload, problem, fragment = BAD_CASES[case]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(payload)
    policy = BadRecordPolicy("raise")
    with pytest.raises(BadRecordError) as err:
        [policy.accept(r) for r in build_source({"kind": "files", "paths": str(path)}).stream(0, 1)]
    assert str(path) in str(err.value) and problem in str(err.value) and fragment in str(err.value)


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_record_skip_is_counted(tmp_path: Path, case: str):
    payload, problem, _ = BAD_CASES[case]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(payload * 3)
    policy = BadRecordPolicy("skip")
    good = [r.text for r in build_source({"kind": "files", "paths": str(path)}).stream(0, 1) if policy.accept(r)]
    assert good == ["ok"] * 3 and dict(policy.counts) == {problem: 3}


def test_missing_file_and_bad_kind_and_policy(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        build_source({"kind": "files", "paths": str(tmp_path / "nothing-here*.jsonl")})
    with pytest.raises(KeyError, match="valid kinds"):
        build_source({"kind": "ftp"})
    with pytest.raises(ValueError, match="on_bad_record"):
        BadRecordPolicy("ignore")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        _texts({"kind": "files", "paths": str(tmp_path / "x.csv")})


def test_a_directory_as_data_path_gets_its_own_message(tmp_path: Path):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "a.jsonl").write_text('{"text": "ok"}\n')
    for pattern in (str(tmp_path / "shards"), str(tmp_path / "shard*")):
        with pytest.raises(IsADirectoryError, match=re.escape(f"data path '{pattern}' names a directory")):
            build_source({"kind": "files", "paths": pattern})
    # a recursive glob's directories are passed over when it also matches files
    assert expand_paths(str(tmp_path / "**")) == [tmp_path / "shards" / "a.jsonl"]


def test_a_file_whose_name_holds_glob_characters_is_found(tmp_path: Path):
    """'part[1].jsonl' as a glob matches only 'part1.jsonl': the file named was refused as matching nothing."""
    WRITERS["a.jsonl"](tmp_path / "part[1].jsonl")
    assert expand_paths(str(tmp_path / "part[1].jsonl")) == [tmp_path / "part[1].jsonl"]
    assert _texts({"kind": "files", "paths": str(tmp_path / "part[1].jsonl")}) == DOCS
    assert expand_paths(str(tmp_path / "part[[]1].jsonl")) == [tmp_path / "part[1].jsonl"]  # (escaped: as before)


def test_skipped_records_are_logged_a_few_times_per_reason(tmp_path: Path, caplog):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": ""}\n' * 5)
    policy = BadRecordPolicy("skip")
    with caplog.at_level(logging.WARNING):
        [policy.accept(r) for r in build_source({"kind": "files", "paths": str(path)}).stream(0, 1)]
    lines = [r.getMessage() for r in caplog.records]
    assert dict(policy.counts) == {"empty_document": 5}
    assert lines[:3] == [f"skipped bad record at {path}:line {n}: empty_document: field 'text' is empty or whitespace"
                         for n in (2, 4, 6)]  # fmt: skip
    assert len(lines) == 4 and "further empty_document records" in lines[3]


def test_parquet_wrong_column_names_the_file(tmp_path: Path):
    WRITERS["a.parquet"](tmp_path / "a.parquet")
    with pytest.raises(DataFileError, match=re.escape(f"cannot read {tmp_path / 'a.parquet'}: no column 'body'")):
        _texts({"kind": "files", "paths": str(tmp_path / "a.parquet"), "field": "body"})


UNREADABLE = {  # file -> (content, what the error says after "cannot read <file>: ")
    "a.jsonl.gz": (b'{"text": "x"}\n', "Not a gzipped file"),
    "a.jsonl.bz2": (b'{"text": "x"}\n', "Invalid data stream"),
    "a.jsonl.zst": (b'{"text": "x"}\n', "zstd decompress error"),
    "a.parquet": (b"not parquet", "Parquet"),
    "a.json": (b'{"text": "x"}', "a .json source must hold a JSON array of objects, got dict"),
}


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_a_file_that_cannot_be_read_is_a_data_file_error_naming_it(tmp_path: Path, name: str):
    """gzip, bz2, zstandard and pyarrow raised their own errors (zstandard's not even an OSError), naming no file:
    `klalm-train` printed them with Hydra's traceback, `klalm-prepare-data` a .zst's too."""
    content, says = UNREADABLE[name]
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataFileError, match=re.escape(f"cannot read {tmp_path / name}: {says}")):
        _texts({"kind": "files", "paths": str(tmp_path / name)})


def test_a_file_of_another_type_is_refused_before_any_is_read(tmp_path: Path):
    """`data/*` matching a README.md beside the corpus: refused when the source is built (a data module, before the
    model), not once the loader reached it."""
    WRITERS["a.jsonl"](tmp_path / "a.jsonl")
    (tmp_path / "README.md").write_text("about the corpus\n")
    with pytest.raises(ValueError, match="unsupported file type 'README.md'"):
        build_source({"kind": "files", "paths": str(tmp_path / "*")})


def test_pipeline_counts_skips_in_state_and_never_hangs(tmp_path: Path, gpt2):
    rows = b'{"text": "good words here"}\n{"text": ""}\n{"oops": 1}\nnot json\n' * 5
    (tmp_path / "mixed.jsonl").write_bytes(rows)
    source = build_source({"kind": "files", "paths": str(tmp_path / "mixed.jsonl")})
    dataset = PackedTextDataset(source, gpt2, seq_len=4, batch_size=1, loop=False, on_bad_record="skip")
    batches = list(dataset)
    assert len(batches) == 4  # 5 good docs x (3 tokens + EOS) = 20 tokens = 4 windows of 5, nothing left over
    assert dataset.state_dict()["bad"] == {"empty_document": 4, "missing_field": 4, "corrupt_json": 4}
    with pytest.raises(BadRecordError, match="mixed.jsonl:line 2"):
        list(PackedTextDataset(source, gpt2, seq_len=4, batch_size=1, loop=False))
    (tmp_path / "allbad.jsonl").write_bytes(b'{"text": ""}\n' * 3)
    allbad = build_source({"kind": "files", "paths": str(tmp_path / "allbad.jsonl")})
    looping = PackedTextDataset(allbad, gpt2, seq_len=4, batch_size=1, on_bad_record="skip")
    with pytest.raises(NoDocumentsError, match="no usable document"):  # klalm-train's USER_ERRORS: one line
        next(iter(looping))


# records cycle good / empty / corrupt; 8 batches = 8 good documents (4 tokens each); counts cover the records
# consumed so far. 0 workers: records 0..21 -> 7 empty, 7 corrupt. 2 workers (even/odd records, 4 documents
# each): worker 0 stops at record 18 (3 + 3), worker 1 at record 21 (4 empty, 3 corrupt).
@pytest.mark.parametrize(
    ("workers", "expected"),
    [(0, {"empty_document": 7, "corrupt_json": 7}), (2, {"empty_document": 7, "corrupt_json": 6})],
)
def test_datamodule_reports_skipped_records(tmp_path: Path, gpt2_config, workers, expected):
    from klalm.data import TextDataModule

    (tmp_path / "mixed.jsonl").write_bytes(b'{"text": "good words here"}\n{"text": ""}\nnot json\n' * 8)
    module = TextDataModule(
        source={"kind": "files", "paths": str(tmp_path / "mixed.jsonl")},
        tokenizer=gpt2_config,
        seq_len=3,
        batch_size=1,
        num_workers=workers,
        block_docs=3,
        shuffle=False,
        on_bad_record="skip",
    )
    iterator = iter(module.train_dataloader())
    [next(iterator) for _ in range(8)]
    assert module.skipped_records() == expected
