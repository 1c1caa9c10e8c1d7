"""Which code wrote a result: the commit that results files record beside their numbers."""

from __future__ import annotations

import os
import subprocess


def git_commit() -> str:
    """$KLALM_COMMIT, else git's short HEAD, with "-dirty" when tracked files differ from it (a run of uncommitted
    code, or a copied tree whose .git is stale), else "unknown"."""
    if "KLALM_COMMIT" in os.environ:
        return os.environ["KLALM_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                 text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if changed.stdout.strip() else "")
