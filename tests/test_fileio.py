"""klalm.fileio: a file is replaced whole on success and left as it was on an error, with no temporary file left (nor
one a killed writer left), and a symbolic link is written through; a plot likewise; an flock on a path holds until
let go."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from klalm import fileio
from klalm.fileio import atomic_path, flock_path, flocked, save_figure, write_atomic


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
        assert temporary.parent == tmp_path and temporary.name.startswith(".state.pt.tmp-")
        assert not temporary.match("*.pt")  # not a *.pt a reader of the folder would take for a whole file
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


def test_a_write_removes_the_temporaries_dead_writers_of_the_file_left(tmp_path):
    """A writer killed mid-write (SIGKILL: no cleanup) left its temporary, under a random name that nothing found,
    and every kill added one. Those of a dead process (or of this one's pid, reused) go at the next write of the
    file; a live writer's, another file's and another host's stay."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    prefix = f".summary.json.tmp-{fileio._HOST}-"
    stale = [f"{prefix}{dead.stdout.strip()}-0", f"{prefix}{os.getpid()}-999999"]
    kept = [f"{prefix}{os.getppid()}-0", f".other.json.tmp-{fileio._HOST}-{dead.stdout.strip()}-0",
            f".summary.json.tmp-elsewhere-{dead.stdout.strip()}-0"]  # fmt: skip
    recent = f"{prefix}{dead.stdout.strip()}-1"  # maybe a writer in a container sharing the host's name: too new
    long_ago = time.time() - fileio.STALE_AFTER_S - 1
    for name in stale + kept + [recent, f"{prefix}{10**30}-0"]:  # (a pid no process can have: left alone)
        (tmp_path / name).write_text("half writ")
        if name != recent:
            os.utime(tmp_path / name, (long_ago, long_ago))
    kept += [recent, f"{prefix}{10**30}-0"]
    with atomic_path(tmp_path / "summary.json") as outer:
        write_atomic(tmp_path / "summary.json", "inner")  # a write in progress (`outer`) is not stale
        outer.write_text("outer")
    assert (tmp_path / "summary.json").read_text() == "outer"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, "summary.json"])


def test_a_symbolic_link_is_written_through_to_its_target(tmp_path):
    """`os.replace` onto a link put a file in the link's place: the link now stays and its target gets the data."""
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "results.json"
    target.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["latest.json", "results.json", "runs"]


def test_an_error_about_the_temporary_names_the_file_being_written(tmp_path):
    """A missing folder's error named the temporary (`.summary.json.tmp-<host>-<pid>-<n>`), a file nobody asked for."""
    path = tmp_path / "no" / "such" / "summary.json"
    with pytest.raises(FileNotFoundError) as raised:
        write_atomic(path, "x")
    assert raised.value.filename == str(path) and str(raised.value).endswith(f"'{path}'")
    with pytest.raises(ValueError, match="^not about a file$"), atomic_path(tmp_path / "a"):
        raise ValueError("not about a file")


class _Figure:
    """What `save_figure` needs of a matplotlib Figure: `savefig` into a file object, the format named."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails

    def savefig(self, out, format=None, **kwargs):
        out.write(f"{format} {kwargs}".encode())
        if self.fails:
            raise OSError("cut off mid-write")


def test_save_figure_writes_the_format_its_suffix_names_over_an_old_file(tmp_path):
    (tmp_path / "loss.svg").write_text("old")
    save_figure(_Figure(), tmp_path / "loss.svg", dpi=120)
    save_figure(_Figure(), tmp_path / "loss", dpi=120)  # no suffix: matplotlib's default format
    assert (tmp_path / "loss.svg").read_text() == "svg {'dpi': 120}"
    assert (tmp_path / "loss").read_text() == "None {'dpi': 120}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss", "loss.svg"]


def test_a_figure_cut_off_mid_write_leaves_the_old_image_whole(tmp_path):
    (tmp_path / "loss.png").write_bytes(b"old image")
    with pytest.raises(OSError, match="cut off mid-write"):
        save_figure(_Figure(fails=True), tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes() == b"old image"
    assert [p.name for p in tmp_path.iterdir()] == ["loss.png"]


def test_flock_path_holds_a_folder_or_a_file_until_closed_and_nothing_without_flock(tmp_path, monkeypatch):
    first = flock_path(tmp_path)  # a folder, opened read-only
    with pytest.raises(BlockingIOError):
        flock_path(tmp_path)  # another open file, as another process's: refused, not waited for
    os.close(first)
    with flocked(tmp_path / ".lock", os.O_CREAT | os.O_WRONLY, wait=True), pytest.raises(BlockingIOError):
        flock_path(tmp_path / ".lock")
    os.close(flock_path(tmp_path / ".lock"))  # the block let it go
    monkeypatch.setitem(sys.modules, "fcntl", None)  # `import fcntl` fails, as on Windows
    assert flock_path(tmp_path / "new", os.O_CREAT | os.O_WRONLY) is None and not (tmp_path / "new").exists()
