"""`klalm-prepare-data`'s writer: a split is tokenised as it is read, and a killed run's leftovers are cleaned up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from klalm.data import prepare
from klalm.data.records import BadRecordPolicy, Record


class CountingSource:
    """A source of `n` one-word documents that counts how many it has handed out."""

    def __init__(self, n: int, fail_at: int | None = None):
        self.n, self.fail_at, self.read = n, fail_at, 0

    def stream(self, consumer: int, num_consumers: int):
        for i in range(self.n):
            if i == self.fail_at:
                raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            self.read += 1
            yield Record(f"document {i}", f"mem:{i}")

    def describe(self) -> str:
        return "counting source"


def test_documents_are_tokenised_while_the_source_is_read(gpt2, tmp_path, monkeypatch):
    src, read_at_each_add = CountingSource(10), []
    real_add = prepare.ShardWriter.add

    def add(self, tokens):
        read_at_each_add.append(src.read)
        real_add(self, tokens)

    monkeypatch.setattr(prepare.ShardWriter, "add", add)
    index = prepare._write_shards({}, src, BadRecordPolicy("raise"), gpt2, tmp_path / "out", 1000, "auto", 4, False)
    assert index["documents"] == 10
    # blocks of 4: the first block is written after 4 records, not after all 10 (the whole split used to be read
    # into memory before the first was tokenised)
    assert read_at_each_add == [4] * 4 + [8] * 4 + [10] * 2


def test_a_file_that_fails_midway_is_named(gpt2, tmp_path):
    with pytest.raises(ValueError, match="cannot read counting source: Compressed file ended"):
        prepare._write_shards(
            {}, CountingSource(10, fail_at=7), BadRecordPolicy("raise"), gpt2, tmp_path / "out", 1000, "auto", 4, False
        )


def test_a_killed_runs_staging_folder_is_removed_and_a_live_ones_kept(files_args, tmp_path):
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = out / f".partial-{int(dead.stdout)}-abc123"  # what a SIGKILLed run leaves behind
    live = out / f".partial-{os.getpid()}-def456"
    other = out / ".partial-notapid"
    for folder in (stale, live, other):
        (folder / "train").mkdir(parents=True)
    prepare.main([*files_args, "--splits", "train", "--out", str(out), "--no-progress"])
    assert sorted(p.name for p in out.iterdir()) == sorted(["tokenizer", "train", live.name, other.name])
