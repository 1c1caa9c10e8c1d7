"""Which code wrote a result: the commit that results files record beside their numbers.

A clean checkout records its short HEAD. A tree that differs from HEAD (uncommitted work, or a copy of the
repository whose .git is older than its files, as on a machine that receives the working tree) records
"HEAD-dirty (tree T)": T is git's hash of every file that is not ignored, as `git write-tree` would store them, so
it names the exact code that ran. Once that code is committed, the commit whose tree it is can be found with

    git log --format='%h %T' | grep <T>

The checkout is the one klalm's own files lie in (SOURCE), whatever folder the command ran from; klalm installed
outside a checkout, or in a folder its checkout ignores (a virtual environment inside it), records "unknown".

Untracked files that are not ignored count (new code is code that ran), unless together they pass
UNTRACKED_LIMIT_BYTES (data left in the checkout, say): then T holds the tracked files only and the record says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent  # git runs here: the checkout of the code that runs
TREE_DIGITS = 12  # of the tree hash recorded with "-dirty"
UNTRACKED_LIMIT_BYTES = 64 << 20  # untracked files hashed into the tree only up to this many bytes in all


def _git(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, check=True, env=env, cwd=SOURCE)
    return done.stdout.strip()


def _untracked_bytes() -> int:
    top = _git("rev-parse", "--show-toplevel")
    names = _git("ls-files", "--others", "--exclude-standard", "-z", "--full-name", top).split("\0")
    return sum(os.path.getsize(os.path.join(top, n)) for n in names if n and os.path.isfile(os.path.join(top, n)))


def worktree_tree(with_untracked: bool = True) -> str:
    """Git's tree hash of the working tree: tracked files and (with_untracked) untracked ones, ignored ones left
    out. Built in a copy of the index, so the real index (what is staged) is not touched; the files' blobs are
    written to the object store as `git add` writes them."""
    with tempfile.TemporaryDirectory() as tmp:
        index = os.path.join(tmp, "index")
        real = os.path.join(SOURCE, _git("rev-parse", "--git-path", "index"))  # relative to SOURCE, or absolute
        if os.path.exists(real):
            # its stat data spares hashing the files that did not change; copied with its own time, by which git tells
            # an entry written in the index's last tick ("racily clean": its content is checked) from a settled one
            shutil.copy2(real, index)
        env = {**os.environ, "GIT_INDEX_FILE": index}
        _git("add", "--all" if with_untracked else "--update", ":/", env=env)
        return _git("write-tree", env=env)


def git_commit() -> str:
    """$KLALM_COMMIT, else git's short HEAD, with "-dirty (tree T)" when the files (untracked ones too, ignored ones
    not) differ from it (see the module doc), else "unknown" outside a git checkout."""
    if "KLALM_COMMIT" in os.environ:
        return os.environ["KLALM_COMMIT"]
    try:
        head = _git("rev-parse", "--short", "HEAD")
        if subprocess.run(["git", "check-ignore", "-q", "."], cwd=SOURCE).returncode == 0:
            return "unknown"  # installed into an ignored folder of some checkout: not that checkout's code
        with_untracked = _untracked_bytes() <= UNTRACKED_LIMIT_BYTES
        tree = worktree_tree(with_untracked)
        head_tree = _git("rev-parse", "HEAD^{tree}")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    if tree == head_tree:
        return head if with_untracked else f"{head} (untracked files too large to hash were left out)"
    left_out = "" if with_untracked else ", untracked files left out"
    return f"{head}-dirty (tree {tree[:TREE_DIGITS]}{left_out})"
