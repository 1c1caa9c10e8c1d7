"""What `resume=` resolves to: a checkpoint that passed verification, or a fresh start.

    resume=null         a fresh run
    resume=auto         the newest valid checkpoint of every earlier run with this run_name (`paths.resume_glob`),
                        or a fresh run when there is none
    resume=<run dir>    the newest valid checkpoint in that folder
    resume=<file>       that checkpoint; if it fails verification the run stops, naming the file and why

"Valid" is `klalm.train.checkpoint.verify_checkpoint`: the sha256 written at save time and a safe load. A newer
checkpoint that fails (truncated by a full disk, corrupted, not a trusted klalm checkpoint) is skipped with a warning
that names it and the reason, so a damaged newest file never makes every restart crash.
"""

from __future__ import annotations

import logging
from glob import glob
from pathlib import Path

from klalm.train.checkpoint import newest_valid, verify_checkpoint

log = logging.getLogger(__name__)


def resolve_resume(resume: str | None, search_glob: str) -> Path | None:
    """The verified checkpoint to resume from (None: a fresh run); see the module docstring.

    Raises:
        CheckpointError: an explicit file, or every checkpoint of an explicit run folder, fails verification.
        FileNotFoundError: an explicit run folder holds no checkpoint.
    """
    if resume is None:
        return None
    if resume == "auto":
        return _newest_valid_or_none(sorted(Path(p) for p in glob(search_glob)), f"resume=auto (over {search_glob})")
    path = Path(resume)
    if path.is_file():
        verify_checkpoint(path)
        return path
    latest = _newest_valid_or_none([path], f"resume={resume}")
    if latest is None:
        raise FileNotFoundError(f"resume={resume!r}: the run folder holds no valid checkpoints/step-*.ckpt")
    return latest


def _newest_valid_or_none(run_dirs: list[Path], what: str) -> Path | None:
    """The newest valid checkpoint over `run_dirs`, logging each one skipped on the way and the choice."""
    latest, skipped = newest_valid(run_dirs)
    for reason in skipped:
        log.warning("%s: skipped %s", what, reason)
    log.info("%s: %s", what, f"resuming from {latest}" if latest else "no valid checkpoint, starting fresh")
    return latest
