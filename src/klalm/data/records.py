"""Reading documents out of local files: jsonl / json / parquet / txt, plain or .gz / .bz2 / .zst compressed.

A *record* is one candidate document: a line of a jsonl file, an item of a json array, a row of a parquet file,
or a whole txt file. Records are numbered globally across the sorted file list, which is what lets every
consumer (rank × DataLoader worker) own a disjoint, exhaustive subset of them (record index modulo consumers).

Raw records are cheap to skip (no JSON parsing, no UTF-8 decoding); only owned records are decoded, and a
record that cannot become a document is returned as a `Record` with `problem` set, never silently dropped.
The caller applies the policy (`BadRecordPolicy`): raise naming file, line and field, or skip and count.
"""

from __future__ import annotations

import bz2
import codecs
import glob
import gzip
import io
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from klalm.errors import one_line, skip_hint

log = logging.getLogger(__name__)

LOGGED_SKIPS_PER_REASON = 3  # skipped records logged one by one per reason and consumer; the rest are only counted


@dataclass(frozen=True)
class Record:
    """One decoded record: a document text, or the reason it is not one.

    Attributes:
        text: the document text (None when the record is bad).
        where: human-readable location, e.g. ``enwiki-00003.jsonl.gz:line 17``.
        problem: None for a good record, else a short reason key ("corrupt_json", "invalid_utf8",
            "missing_field", "not_text", "empty_document").
        detail: longer explanation used in error messages.
    """

    text: str | None
    where: str
    problem: str | None = None
    detail: str = ""


class BadRecordError(ValueError):
    """A record could not be turned into a document and the policy is ``on_bad_record="raise"``; its message ends
    with the setting that skips such records, which the commands spell their own way (`klalm.errors.in_command_terms`).
    """


class DataFileError(ValueError):
    """A data file that cannot be read at all, whatever the policy: a damaged or mislabelled compressed file, a .json
    that is not an array, a parquet file without the field, a shard folder whose files disagree with its index
    (`klalm-train` and `klalm-prepare-data` refuse it in one line naming the file)."""


class BadRecordPolicy:
    """Applies ``on_bad_record`` ("raise" | "skip") and counts skipped records by reason.

    Skips are logged (file, line, reason) for the first `LOGGED_SKIPS_PER_REASON` of each reason, then once more
    to say that further ones are only counted; the training metrics and summary.json report the counts.
    """

    def __init__(self, on_bad_record: Literal["raise", "skip"] = "raise", counts: dict[str, int] | None = None):
        if on_bad_record not in ("raise", "skip"):
            raise ValueError(f"on_bad_record must be 'raise' or 'skip', got {on_bad_record!r}")
        self.on_bad_record = on_bad_record
        self.counts: Counter[str] = Counter(counts or {})

    def accept(self, record: Record) -> bool:
        """True if the record is a usable document; raises or counts otherwise."""
        if record.problem is None:
            return True
        if self.on_bad_record == "raise":
            raise BadRecordError(f"bad record at {record.where}: {record.problem}: {record.detail} {skip_hint()}")
        self.counts[record.problem] += 1
        count = self.counts[record.problem]
        if count <= LOGGED_SKIPS_PER_REASON:
            log.warning("skipped bad record at %s: %s: %s", record.where, record.problem, record.detail)
        if count == LOGGED_SKIPS_PER_REASON:
            log.warning("further %s records are skipped without a log line (counted in the metrics)", record.problem)
        return False


# ---------------------------------------------------------------------------------------------------------------
# Opening files


def _open_zstd(path: Path) -> IO[bytes]:
    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)  # noqa: SIM115 (opener)
    return io.BufferedReader(reader)  # zstandard's reader has no readline


def _open_plain(path: Path) -> IO[bytes]:
    return open(path, "rb")


COMPRESSIONS: dict[str, Callable[[Path], IO[bytes]]] = {
    ".gz": lambda p: gzip.open(p, "rb"),  # noqa: SIM115 (openers: the caller closes)
    ".bz2": lambda p: bz2.open(p, "rb"),  # noqa: SIM115
    ".zst": _open_zstd,
    "": _open_plain,
}


def split_suffixes(path: Path) -> tuple[str, str]:
    """(format suffix, compression suffix) of a file name, e.g. ``a.jsonl.gz`` -> (".jsonl", ".gz")."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = suffixes[-1] if suffixes and suffixes[-1] in COMPRESSIONS else ""
    rest = suffixes[:-1] if compression else suffixes
    fmt = rest[-1] if rest else ""
    if fmt not in FORMATS:
        raise ValueError(
            f"unsupported file type {path.name!r}: formats {sorted(FORMATS)}, compressions {sorted(COMPRESSIONS)}"
        )
    return fmt, compression


def open_binary(path: Path) -> IO[bytes]:
    """Opens a possibly compressed file for binary reading (decompressing on the fly)."""
    _, compression = split_suffixes(path)
    return COMPRESSIONS[compression](path)


def expand_paths(patterns: str | list[str]) -> list[Path]:
    """Expands glob patterns (sorted per pattern, patterns in the given order, duplicates removed); a path that exists
    is itself, even where it holds glob characters.

    Raises:
        FileNotFoundError: a pattern matches nothing, naming the pattern.
        IsADirectoryError: a path names a directory, or a pattern matches only directories (a glob's directories
            are passed over when it also matches files, as `data/**` does).
        ValueError: a file of a type no reader takes (e.g. `data/*` matching a README.md), named before any is read.
    """
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    if not patterns:
        raise ValueError("files source needs at least one path or glob pattern in `paths`")
    seen: dict[Path, None] = {}
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        # a path that exists is taken as it is: 'part[1].jsonl' as a pattern matches only 'part1.jsonl'
        matches = [pattern] if os.path.exists(pattern) else sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise FileNotFoundError(f"no file matches {pattern!r}")
        files = [m for m in matches if not os.path.isdir(m)]
        if not files:
            raise IsADirectoryError(
                f"data path {pattern!r} names a directory ({matches[0]}), not files: name its files, e.g. "
                f"'{matches[0]}/*.jsonl.gz'"
            )
        for match in files:
            split_suffixes(Path(match))
            seen.setdefault(Path(match), None)
    return list(seen)


# ---------------------------------------------------------------------------------------------------------------
# Raw records per format: (1-based line/row/item number, raw payload); decode turns a payload into a Record.


def _raw_jsonl(path: Path, field: str) -> Iterator[tuple[int, Any]]:
    with open_binary(path) as f:
        for lineno, line in enumerate(f, start=1):
            if lineno == 1:
                line = line.removeprefix(codecs.BOM_UTF8)  # of the file (Windows tools write one), not of its record
            if line.strip():
                yield lineno, line


def _decode_jsonl(raw: bytes, where: str, field: str) -> Record:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return Record(None, where, "invalid_utf8", str(err))
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        return Record(None, where, "corrupt_json", str(err))
    return _field_of(obj, where, field)


def _field_of(obj: Any, where: str, field: str) -> Record:
    if not isinstance(obj, dict):
        return Record(None, where, "not_text", f"expected a JSON object, got {type(obj).__name__}")
    if field not in obj:
        return Record(None, where, "missing_field", f"no field {field!r} (keys: {sorted(obj)[:10]})")
    return _text_record(obj[field], where, field)


def _text_record(value: Any, where: str, field: str) -> Record:
    if not isinstance(value, str):
        return Record(None, where, "not_text", f"field {field!r} holds {type(value).__name__}, not a string")
    if not value.strip():
        return Record(None, where, "empty_document", f"field {field!r} is empty or whitespace")
    return Record(value, where)


def _raw_json(path: Path, field: str) -> Iterator[tuple[int, Any]]:
    with open_binary(path) as f:
        try:
            items = json.loads(f.read().decode("utf-8-sig"))  # (-sig: without a leading byte order mark)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"not a valid UTF-8 JSON file: {err}") from err
    if not isinstance(items, list):
        raise ValueError(f"a .json source must hold a JSON array of objects, got {type(items).__name__}")
    yield from enumerate(items, start=1)


def _decode_json(raw: Any, where: str, field: str) -> Record:
    return _field_of(raw, where, field)


def _raw_parquet(path: Path, field: str) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    if field not in parquet.schema_arrow.names:
        raise KeyError(f"no column {field!r} (columns: {parquet.schema_arrow.names})")
    row = 0
    for batch in parquet.iter_batches(columns=[field], batch_size=1024):
        for value in batch.column(0).to_pylist():
            row += 1
            yield row, value


def _decode_parquet(raw: Any, where: str, field: str) -> Record:
    return _text_record(raw, where, field)


def _raw_txt(path: Path, field: str) -> Iterator[tuple[int, Any]]:
    with open_binary(path) as f:
        yield 1, f.read()


def _decode_txt(raw: bytes, where: str, field: str) -> Record:
    try:
        text = raw.decode("utf-8-sig")  # a byte order mark is no part of the document
    except UnicodeDecodeError as err:
        return Record(None, where, "invalid_utf8", str(err))
    return _text_record(text, where, "<file>")


# format suffix -> (raw reader, decoder, unit name used in locations)
FORMATS: dict[str, tuple[Callable[..., Iterator[tuple[int, Any]]], Callable[..., Record], str]] = {
    ".jsonl": (_raw_jsonl, _decode_jsonl, "line"),
    ".json": (_raw_json, _decode_json, "item"),
    ".parquet": (_raw_parquet, _decode_parquet, "row"),
    ".txt": (_raw_txt, _decode_txt, "file"),
}


def _zstd_error() -> type[Exception]:
    import zstandard

    return zstandard.ZstdError


def iter_raw_records(path: Path, field: str) -> Iterator[tuple[str, Callable[[], Record]]]:
    """Yields (location, decode thunk) per record of one file; calling the thunk decodes that record only.

    Raises:
        DataFileError: the file cannot be read (gzip, bz2, zstandard, pyarrow and json each raise their own errors,
            and most of them do not name the file), naming it.
    """
    fmt, _ = split_suffixes(path)
    raw_reader, decoder, unit = FORMATS[fmt]
    try:
        for number, raw in raw_reader(path, field):
            where = f"{path}:{unit} {number}"
            yield where, (lambda raw=raw, where=where: decoder(raw, where, field))
    except (OSError, EOFError, KeyError, ValueError, _zstd_error()) as err:
        raise DataFileError(f"cannot read {path}: {one_line(err)}") from err
