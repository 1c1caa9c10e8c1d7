"""What `resume=` resolves to: a checkpoint that passed verification (or a fresh start), and the run folder.

    resume=null         a fresh run
    resume=auto         the newest valid checkpoint of every earlier run with this run_name (`paths.resume_glob`),
                        or a fresh run when there is none
    resume=<run dir>    the newest valid checkpoint in that folder
    resume=<file>       that checkpoint; if it fails verification the run stops, naming the file and why

"Valid" is `klalm.train.checkpoint.verify_checkpoint`: the sha256 written at save time and a safe load. A newer
checkpoint that fails (truncated by a full disk, corrupted, not a trusted klalm checkpoint) is skipped with a warning
that names it and the reason, so a damaged newest file never makes every restart crash.

resume=auto and resume=<run dir> continue in the run folder of the checkpoint they resume from (`run_dir_for`, the
resolver behind `hydra.run.dir`), so one run keeps one metrics.csv, loss.png and samples.txt however often it is
restarted; the config of each restart goes to `.hydra/resume-<time>_<hex>/`, next to the first start's `.hydra/`.
"""

from __future__ import annotations

import logging
from glob import glob
from pathlib import Path

from klalm.train.checkpoint import newest_valid, verify_checkpoint
from klalm.train.rundir import fresh_run_name

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


def run_dir_for(base: str, resume: str | None, search_glob: str, run_id: str | None) -> str:
    """The run folder (`hydra.run.dir`, through the resolver `klalm_run_dir`; see the module docstring).

    Args:
        base: `<log_dir>/<run_name>`, the parent of new run folders.
        resume: the `resume` setting.
        search_glob: `paths.resume_glob`, where resume=auto looks.
        run_id: `$KLALM_RUN_ID` (set by launchers so that every rank names the same new folder) or None.

    Returns:
        The folder of the checkpoint resume=auto would resume from, the folder given as resume=<run dir>, or a new
        folder `<base>/<run_id or fresh_run_name()>`. Every rank of a job reaches the same answer: it depends only on
        the files, and nothing is written before every rank has resolved it.
    """
    if resume == "auto":
        latest, _ = newest_valid(sorted(Path(p) for p in glob(search_glob)))
        if latest is not None:
            return str(latest.parent.parent)  # <run dir>/checkpoints/step-<N>.ckpt
    elif resume is not None and Path(resume).is_dir():
        return str(resume)
    return f"{base}/{run_id or fresh_run_name()}"


def config_subdir(resume: str | None) -> str:
    """Where Hydra writes this start's config inside the run folder (`hydra.output_subdir`, resolver
    `klalm_config_subdir`): `.hydra` for a fresh run; a resume (maybe into the same folder) must not overwrite it."""
    return ".hydra" if resume is None else f".hydra/resume-{fresh_run_name()}"
