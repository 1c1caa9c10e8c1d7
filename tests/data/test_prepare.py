"""`klalm-prepare-data`'s writer: a split is tokenised as it is read, and a killed run's leftovers are cleaned up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from klalm.cli.prepare_data_args import parse_args
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
    index = prepare._write_shards({}, src, BadRecordPolicy("raise"), gpt2, tmp_path / "out", 1000, "auto", 4, None)
    assert index["documents"] == 10
    # blocks of 4: the first block is written after 4 records, not after all 10 (the whole split used to be read
    # into memory before the first was tokenised)
    assert read_at_each_add == [4] * 4 + [8] * 4 + [10] * 2


def test_the_progress_bar_shows_the_rate_of_the_whole_block(gpt2, tmp_path, capsys):
    """The bar was updated per document, so its first print took one document's tokens over the time of reading and
    tokenising the whole block: 1.9k tokens/s on enwiki at 170k."""

    class SlowStart(CountingSource):
        def stream(self, consumer, num_consumers):
            time.sleep(0.5)
            yield from super().stream(consumer, num_consumers)

    index = prepare._write_shards({}, SlowStart(200), BadRecordPolicy("raise"), gpt2, tmp_path / "o", 10**6, "auto",
                                  200, "o")  # fmt: skip
    prints = capsys.readouterr().err.replace("\r", "\n")
    rate, scale = re.findall(r"([\d.]+)([kM]?)tok/s", prints)[0]  # (the first print, at 0 tokens, shows "?tok/s")
    shown = float(rate) * {"": 1, "k": 1e3, "M": 1e6}[scale]
    assert shown > 0.5 * index["total_tokens"] / index["seconds"], prints


def test_the_progress_bar_names_the_output_folder_asked_for(files_args, tmp_path, capsys):
    """It named the temporary folder the split is written into, out/.partial-<random>/train."""
    out = tmp_path / "out"
    prepare.run(parse_args([*files_args, f"val={tmp_path / 'ok.jsonl'}", "--out", str(out)]))
    bars = capsys.readouterr().err.replace("\r", "\n")
    assert f"tokenising -> {out / 'train'}: " in bars and f"tokenising -> {out / 'val'}: " in bars
    assert prepare.STAGING_PREFIX not in bars, bars


def test_a_file_that_fails_midway_is_named(gpt2, tmp_path):
    with pytest.raises(ValueError, match="cannot read counting source: Compressed file ended"):
        prepare._write_shards(
            {}, CountingSource(10, fail_at=7), BadRecordPolicy("raise"), gpt2, tmp_path / "out", 1000, "auto", 4, None
        )


def test_a_killed_runs_staging_folder_is_removed_and_a_live_ones_kept(files_args, tmp_path):
    out = tmp_path / "out"
    stale, live, young = out / ".partial-killed", out / ".partial-live", out / ".partial-young"
    unlocked = out / ".partial-new"
    for folder in (stale, live, young, unlocked):
        (folder / "train").mkdir(parents=True)
    for folder in (stale, live, young):  # lock files held by no process yet
        (folder / prepare.STAGING_LOCK).touch()
    an_hour_ago = time.time() - 3600
    for folder in (stale, live):
        os.utime(folder / prepare.STAGING_LOCK, (an_hour_ago, an_hour_ago))
    # a live run's, held by another process (flock locks belong to the open file, so a child holds its own)
    hold = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(120)")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", hold, str(live / prepare.STAGING_LOCK)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout.readline() == "locked\n"
        prepare.run(parse_args([*files_args, "--splits", "train", "--out", str(out), "--no-progress"]))
    finally:
        holder.kill()
        holder.wait()
    # left alone too: a folder without a lock file, or whose lock file is under a minute old (its run may be taking
    # the lock this instant)
    assert sorted(p.name for p in out.iterdir()) == sorted(["tokenizer", "train", live.name, young.name, unlocked.name])


def test_the_writing_run_holds_its_staging_lock(files_args, tmp_path, monkeypatch):
    out, seen = tmp_path / "out", []
    real_swap_in = prepare._swap_in

    def swap_in(staging, out_dir, names):
        with pytest.raises(BlockingIOError):  # what a second run's clean-up would meet
            os.close(prepare._lock(staging / prepare.STAGING_LOCK))
        seen.append(staging)
        real_swap_in(staging, out_dir, names)

    monkeypatch.setattr(prepare, "_swap_in", swap_in)
    prepare.run(parse_args([*files_args, "--splits", "train", "--out", str(out), "--no-progress"]))
    assert seen and not seen[0].exists()


def test_a_file_system_without_locks_writes_without_one_and_leaves_nothing(files_args, tmp_path, monkeypatch):
    """NFS without its lock service, some FUSE or Lustre mounts: flock fails with ENOLCK and the like. The run
    writes unlocked (and cleans up no other folder: it cannot tell a live run's from a dead one)."""
    import errno
    import fcntl

    def flock(descriptor, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)
    out = tmp_path / "out"
    (out / ".partial-other").mkdir(parents=True)
    (out / ".partial-other" / prepare.STAGING_LOCK).touch()
    os.utime(out / ".partial-other" / prepare.STAGING_LOCK, (time.time() - 3600,) * 2)
    prepare.run(parse_args([*files_args, "--splits", "train", "--out", str(out), "--no-progress"]))
    assert sorted(p.name for p in out.iterdir()) == [".partial-other", "tokenizer", "train"]


def test_a_failure_to_lock_leaves_no_new_output_folder(files_args, tmp_path, monkeypatch):
    import errno
    import fcntl

    def flock(descriptor, operation):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", flock)
    with pytest.raises(SystemExit, match="Bad file descriptor"):
        prepare.run(parse_args([*files_args, "--splits", "train", "--out", str(tmp_path / "out"), "--no-progress"]))
    assert not (tmp_path / "out").exists()
