"""Run folders: a name no other run gets, and one writer per folder.

A fresh run folder is `<log_dir>/<run_name>/<time>_<6 hex digits>`: two runs started in the same second still get
two folders. Launchers set `$KLALM_RUN_ID` instead, so that all ranks of one job (which compose their configs
independently) share one folder.

One writer: global rank 0 holds an exclusive `flock` on `<run_dir>/.klalm.lock` while it runs, and a second
`klalm-train` aimed at the same folder refuses to start, naming the holder (the file records its pid, host and
start). Two writers would interleave metrics.csv, app.log and samples.txt, overwrite each other's checkpoints and
prune each other's files. The kernel drops the lock when its process dies, however it dies, so a lock left by a
killed run is no obstacle; the next run finds the dead holder's record in the file and logs that it took over.
A clean exit empties the file. Other ranks take no lock and write nothing there: they log to their console.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from glob import glob
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig

log = logging.getLogger(__name__)

LOCK_FILE = ".klalm.lock"
# Environment variables that give a process's rank under torchrun, SLURM or Lightning's own launcher.
_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "NODE_RANK", "LOCAL_RANK")
_held: dict[Path, int] = {}  # run folders this process holds: resolved path -> file descriptor of the lock file
_new_folders: set[Path] = set()  # folders of new run folders' paths that did not exist when this process named them


class RunDirInUseError(RuntimeError):
    """Another live process writes to the run folder."""


class RunDirTakenError(ValueError):
    """The run folder holds an earlier run, which a start that does not continue it would overwrite."""


@functools.cache
def fresh_run_name() -> str:
    """`<time>_<6 hex digits>`, e.g. `2026-11-30_14-00-00_3fa2c1`; one value per process, so that every resolution of
    `hydra.run.dir` in this process (Hydra's, Lightning's launcher's) names the same folder."""
    return f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{secrets.token_hex(3)}"


def new_folder(path: str) -> str:
    """Returns `path`, a new run folder this process names (resolver `klalm_new_folder`, and `run_dir_for`), noting
    which of its folders do not exist yet: `remove_run_folder` removes those it leaves empty, and no others. Paths
    are made absolute without following links, so a folder reached through a link is never taken for its target."""
    absolute = Path(os.path.abspath(path))
    _new_folders.update(p for p in (absolute, *absolute.parents) if not p.exists() and not p.is_symlink())
    return path


def is_new_folder(path: str | Path) -> bool:
    """Whether `path` is a run folder this process named (`new_folder`) when it did not exist yet."""
    return Path(os.path.abspath(path)) in _new_folders


def eval_dir(output_dir: Any) -> str:
    """`klalm-eval`'s folder (`hydra.run.dir`, resolver `klalm_eval_dir`), where Hydra writes the log (eval.log) and
    the config record: `output_dir` itself (`~` expanded), so that they go where the results go. For output_dir=null,
    and for one that cannot be a folder (not a string, blank, a file on its path, a folder that takes no file), a new
    `outputs/eval/<fresh_run_name()>`; the evaluation refuses a non-string output_dir or one that cannot be created,
    naming it, and removes that folder (a read-only folder that exists fails only as the results are written)."""
    if isinstance(output_dir, str) and output_dir.strip():
        path = Path(output_dir).expanduser()
        existing = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), Path("."))
        try:
            tempfile.TemporaryFile(dir=existing).close()  # (an existing folder that takes a new file)
            return str(path)
        except OSError:  # a file, a folder that cannot be written
            pass
    return f"outputs/eval/{fresh_run_name()}"


def eval_config_subdir(run_dir: str) -> str:
    """Where Hydra records `klalm-eval`'s config in its folder `run_dir` (`hydra.output_subdir`, resolver
    `klalm_eval_config_subdir`, resolved as Hydra writes the record): `.hydra`, or `.hydra/eval-<fresh_run_name()>`
    beside the record the folder already holds (an output_dir evaluated into before, a training run's folder), which
    is left as it is."""
    return f".hydra/eval-{fresh_run_name()}" if (Path(run_dir) / ".hydra").exists() else ".hydra"


def is_global_rank_zero() -> bool:
    """Whether this process is global rank 0, read from the launcher's environment (before any process group)."""
    return all(int(os.environ.get(name, "0")) == 0 for name in _RANK_VARIABLES)


def in_sweep() -> bool:
    """Whether this process runs a job of a sweep (Hydra's multirun), whose folder hydra.sweep.dir places."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def lock_run_dir(run_dir: str | Path) -> None:
    """Makes this process the only writer of `run_dir` (global rank 0 only; a no-op where the lock is already held).

    Raises:
        RunDirInUseError: another live process holds the folder; the message names it and the folder.
    """
    path = Path(run_dir).resolve()
    if path in _held or not is_global_rank_zero():
        return
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = _read(fd)
        os.close(fd)
        if err.errno not in (errno.EAGAIN, errno.EACCES):  # ENOLCK, EOPNOTSUPP: a filesystem without locks
            log.warning("run folder %s: file locks unsupported here (%s); one writer is not enforced", path, err)
            return
        raise RunDirInUseError(
            f"run folder {path} is in use by another klalm-train ({holder or 'holder unknown'}); two writers would "
            "corrupt its checkpoints and metrics: wait for that run to end, or choose another run_name or "
            "hydra.run.dir"
        ) from None
    previous = _read(fd)
    if previous:
        log.warning("run folder %s: its previous writer (%s) ended without releasing it; taking over", path, previous)
    record = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode(), 0)
    _held[path] = fd


def unlock_run_dir(run_dir: str | Path) -> None:
    """Releases a folder locked by `lock_run_dir` in this process (emptying the record: a clean end)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def check_run_dir_free(run_dir: str | Path, resume_from: Path | None, *, sweep: bool = False) -> None:
    """Refuses to start in a folder that holds an earlier run (its checkpoints or summary.json) unless this start
    continues it, resuming from one of its checkpoints: a fresh start there would overwrite its checkpoints, export,
    config record and summary and append to its metrics. Nothing else counts: a folder holding what a refused start
    wrote (`STARTUP_FILES`) is free. Global rank 0 only: other ranks may start after rank 0 has written there.
    With `sweep`, the folder is a sweep job's (`klalm.train.sweep.check_sweep_jobs`), which hydra.sweep.dir places.

    Raises:
        RunDirTakenError: the folder holds a run and `resume_from` (the checkpoint this start resumes from) is not one
            of its checkpoints; the message names the folder and what to do.
    """
    path = Path(run_dir).resolve()
    if not is_global_rank_zero() or (resume_from is not None and _same_folder(Path(resume_from).parent.parent, path)):
        return
    held = []
    if (path / "checkpoints").is_dir():
        from klalm.models.checkpoint import list_checkpoints  # torch: only for a folder that may hold a run

        if list_checkpoints(path):
            held.append("checkpoints")
    if (path / "summary.json").is_file():
        held.append("summary.json")
    if held:
        how = (
            f"give the sweep another hydra.sweep.dir, or continue that job alone (klalm-train resume={path} with its "
            "overrides)"
            if sweep
            else f"continue it with resume={path}, or start in another folder (hydra.run.dir)"
        )
        raise RunDirTakenError(f"run folder {path} already holds a run ({' and '.join(held)}), which this start would "
                               f"overwrite: {how}")  # fmt: skip


def _same_folder(a: Path, b: Path) -> bool:
    """Whether `a` and `b` are one folder (a symlinked checkpoints/ or a bind mount does not resolve to one path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# What a start writes into its run folder before it trains (folder entries, and one path inside): Hydra's config
# record and log, the lock, the run's tokenizer and the CSV logger's record of the hyperparameters.
STARTUP_FILES = frozenset({".hydra", "train.log", LOCK_FILE, "tokenizer", "csv/hparams.yaml"})


def _startup_file(path: Path, run_dir: Path) -> bool:
    relative = path.relative_to(run_dir)
    return relative.parts[0] in STARTUP_FILES or relative.as_posix() in STARTUP_FILES


def remove_run_folder(run_dir: Path) -> None:
    """Removes a run folder this process named and left unused (`klalm-train`'s and `klalm-eval`'s refusals): closes
    the log file Hydra's handler holds open in it, removes it, and then the folders above it that this process
    created (`new_folder`: outputs/<name>, outputs/) while they are empty. A folder that was there, or a link, stays."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == run_dir.resolve():
            handler.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    for folder in Path(os.path.abspath(run_dir)).parents:
        if folder not in _new_folders or folder.is_symlink():
            break
        try:
            folder.rmdir()
        except OSError:  # not empty: another run's folder is in it
            break


def discard_unused_run_dir(since: float) -> bool:
    """After a start refused for its input (a bad value, a missing file): removes what it wrote if nothing used it, so
    that a rejected command leaves no empty run folder behind.

    The whole folder when this process named it (`fresh_run_name`: not a folder given as `hydra.run.dir` or by a
    launcher) and it holds nothing but `STARTUP_FILES`; in a folder that holds more (a resume), this start's
    `.hydra/resume-*` record when nothing else in the folder was written since `since` (the start's time: a start
    that trained keeps the record of the config it trained with). Global rank 0 only; a no-op outside a Hydra run.
    Returns whether the folder is gone.
    """
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or not is_global_rank_zero():
        return False
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if not run_dir.is_dir():
        return True
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    if run_dir.name == fresh_run_name() and all(_startup_file(p, run_dir) for p in files):
        remove_run_folder(run_dir)  # (a fresh name: no other run aims at this folder)
        unlock_run_dir(run_dir)
        return True
    written = [p for p in files if not _startup_file(p, run_dir) and p.stat().st_mtime >= since]
    if not written and hydra_cfg.output_subdir and Path(hydra_cfg.output_subdir).name.startswith("resume-"):
        shutil.rmtree(run_dir / hydra_cfg.output_subdir, ignore_errors=True)
    return False


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode(errors="replace").strip()


class LockRunDir(HydraCallback):
    """Hydra callback: takes the run folder's lock before Hydra writes `.hydra/` and `app.log` into it, so that a
    refused second run cannot overwrite the first one's config record (single runs; sweep jobs lock in the app).

    A fresh start (resume=null) in a folder that holds an earlier run is refused here too, before Hydra overwrites
    that run's `.hydra/config.yaml` (`check_run_dir_free`; a resume's record goes to `.hydra/resume-*`, and the app
    refuses one that continues another folder's checkpoint), and so is a folder that cannot be created. A sweep's job
    folders are checked so by `klalm.train.sweep.check_sweep_jobs`, before Hydra writes anything of the sweep.

    Hydra turns a callback's exception into a warning and carries on, so a refusal exits here, with its message.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = config.hydra.run.dir
        try:
            if config.resume is None:
                check_run_dir_free(run_dir, None)
            lock_run_dir(run_dir)
        except (RunDirInUseError, RunDirTakenError) as err:
            raise SystemExit(f"klalm-train: {err}") from None
        except OSError as err:  # a file on the path, a path in /proc, no permission
            path = Path(run_dir)
            why = next((f"{p} is a file" for p in (path, *path.parents) if p.is_file()), err.strerror)
            raise SystemExit(f"klalm-train: cannot create the run folder {path}: {why}") from None


def run_dir_for(base: str, resume: str | None, search_glob: str, run_id: str | None) -> str:
    """The run folder (`hydra.run.dir`, through the resolver `klalm_run_dir`; see the module docstring).

    Args:
        base: `<log_dir>/<run_name>`, the parent of new run folders.
        resume: the `resume` setting.
        search_glob: `paths.resume_glob`, where resume=auto looks.
        run_id: `$KLALM_RUN_ID` (set by launchers so that every rank names the same new folder) or None.

    Returns:
        The folder of the checkpoint resume=auto would resume from (`<base>/<run_id>` when it holds a valid one, else
        that of `klalm.models.checkpoint.newest_first` over `search_glob`), the folder given as resume=<run dir> if it
        holds checkpoints, or a new folder `<base>/<run_id or fresh_run_name()>`. Every rank of a job reaches the same
        answer: it depends only on the files, and nothing is written before every rank has resolved it.
    """
    if resume == "auto":
        from klalm.models.checkpoint import newest_valid  # torch: only when resuming, so composing a config stays light

        own = [Path(base) / run_id] if run_id else []  # a launcher's job continues its own folder first (a requeue)
        for folders in (own, sorted(Path(p) for p in glob(search_glob))):
            latest, _ = newest_valid(folders)
            if latest is not None:
                return str(latest.parent.parent)  # <run dir>/checkpoints/step-<N>.ckpt
    elif resume is not None and Path(resume).is_dir():
        from klalm.models.checkpoint import list_checkpoints

        if list_checkpoints(Path(resume)):  # else not a run folder (the run then stops, naming it): write nothing there
            return str(resume)
    return new_folder(f"{base}/{run_id or fresh_run_name()}")


def log_file(path: str) -> str:
    """The run's log file (Hydra's file handler, resolver `klalm_log_file`): `path` on global rank 0, `os.devnull` on
    every other rank. Under torchrun every rank configures Hydra's logging, and each appended its lines to the one
    train.log, in a folder rank 0 may be about to refuse as an earlier run's; the other ranks log to their console
    (torchrun merges them; `--log-dir` keeps them apart)."""
    return path if is_global_rank_zero() else os.devnull


def config_subdir(resume: str | None) -> str | None:
    """Where Hydra writes this start's config inside the run folder (`hydra.output_subdir`, resolver
    `klalm_config_subdir`): `.hydra` for a fresh run; a resume (maybe into the same folder) must not overwrite it.

    None (no record) on every rank but global rank 0, as Lightning's own launcher sets for the ranks it starts: under
    torchrun every rank composes the config, and each would write its own `.hydra/resume-*` into the one folder, or
    `.hydra/` into a folder whose earlier run rank 0 is about to refuse to overwrite."""
    if not is_global_rank_zero():
        return None
    return ".hydra" if resume is None else f".hydra/resume-{fresh_run_name()}"
