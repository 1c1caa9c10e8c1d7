"""klalm.fileio: a file is replaced whole on success and left as it was on an error, with no temporary file left."""

from __future__ import annotations

import pytest

from klalm.fileio import atomic_path, write_atomic


@pytest.mark.parametrize("data", ["text ü\n", b"\x00bytes\xff"])
def test_write_atomic_writes_text_and_bytes_over_an_old_file(tmp_path, data):
    path = tmp_path / "results.json"
    path.write_text("old")
    write_atomic(path, data)
    assert (path.read_bytes() if isinstance(data, bytes) else path.read_text(encoding="utf-8")) == data
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_write_atomic_creates_a_missing_file(tmp_path):
    write_atomic(str(tmp_path / "new.md"), "# table\n")
    assert (tmp_path / "new.md").read_text() == "# table\n"
    assert [p.name for p in tmp_path.iterdir()] == ["new.md"]


def test_atomic_path_replaces_the_target_only_on_leaving_the_block(tmp_path):
    path = tmp_path / "state.pt"
    path.write_bytes(b"old")
    with atomic_path(path) as temporary:
        assert temporary.parent == tmp_path and temporary.name.startswith(".state.pt.")
        assert temporary.suffix == ".tmp"  # not a *.pt a reader of the folder would take for a whole file
        temporary.write_bytes(b"new")
        assert path.read_bytes() == b"old"  # a reader meanwhile sees the old file
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_an_error_keeps_the_old_file_and_removes_the_temporary_one(tmp_path, error):
    path = tmp_path / "summary.json"
    path.write_text("old")
    with pytest.raises(error), atomic_path(path) as temporary:
        temporary.write_text("half writ")
        raise error("cut off mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_an_error_before_anything_is_written_leaves_no_file(tmp_path):
    with pytest.raises(OSError), atomic_path(tmp_path / "index.json"):
        raise OSError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_two_writes_of_one_file_use_different_temporary_paths(tmp_path):
    with atomic_path(tmp_path / "a") as first, atomic_path(tmp_path / "a") as second:
        assert first != second
        first.write_text("1")
        second.write_text("2")
    assert (tmp_path / "a").read_text() == "1"  # the outer block leaves last
