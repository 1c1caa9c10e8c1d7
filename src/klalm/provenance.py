"""Which code wrote a result: the commit that results files record beside their numbers.

A clean checkout records its short HEAD. A tree that differs from HEAD (uncommitted work, or a copy of the
repository whose .git is older than its files, as on a machine that receives the working tree) records
"HEAD-dirty (tree T)": T is git's hash of every file that is not ignored, as `git write-tree` would store them, so
it names the exact code that ran. Once that code is committed, the commit whose tree it is can be found with

    git log --format='%h %T' | grep <T>
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

TREE_DIGITS = 12  # of the tree hash recorded with "-dirty"


def _git(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, env=env).stdout.strip()


def worktree_tree() -> str:
    """Git's tree hash of the working tree: tracked and untracked files, ignored ones left out. Built in a copy of
    the index, so the real index (what is staged) is not touched; the files' blobs are written to the object store
    as `git add` writes them."""
    with tempfile.TemporaryDirectory() as tmp:
        index = os.path.join(tmp, "index")
        real = _git("rev-parse", "--git-path", "index")
        if os.path.exists(real):
            shutil.copyfile(real, index)  # its stat data spares hashing the files that did not change
        env = {**os.environ, "GIT_INDEX_FILE": index}
        _git("add", "--all", env=env)
        return _git("write-tree", env=env)


def git_commit() -> str:
    """$KLALM_COMMIT, else git's short HEAD, with "-dirty (tree T)" when the files (untracked ones too, ignored ones
    not) differ from it (see the module doc), else "unknown" outside a git checkout."""
    if "KLALM_COMMIT" in os.environ:
        return os.environ["KLALM_COMMIT"]
    try:
        head = _git("rev-parse", "--short", "HEAD")
        tree = worktree_tree()
        head_tree = _git("rev-parse", "HEAD^{tree}")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head if tree == head_tree else f"{head}-dirty (tree {tree[:TREE_DIGITS]})"
