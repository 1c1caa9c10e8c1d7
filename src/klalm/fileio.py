"""Writing a file atomically (`atomic_path`, `write_atomic`, `save_figure` for a plot): to a temporary path beside it,
then `os.replace`d onto it, so a reader (or a process started after a kill mid-write) finds the old file or the new
one, never a part. It guards against a process that dies, not a machine that loses power (nothing is fsynced). And
holding an flock on a path (`flock_path`, `flocked`): one process at a time writes there.

A temporary path is `.<name>.tmp-<host>-<pid>-<n>` (`n` counts this process's writes), so what a killed writer left
is recognisable: the next write of the same file removes the temporaries of that file left by processes of this
host that are gone, once untouched for `STALE_AFTER_S` (a container may share the host's name but not its process
table, so a pid not running here does not prove its writer gone). Those of another host (a folder shared between
machines) are left alone, since whether their writer lives cannot be told from here; on a system without POSIX
process probes (Windows) none is removed.

Importing it costs nothing (no klalm module, no third-party package), so any layer may use it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_HOST = re.sub(r"[^\w-]", "_", socket.gethostname())
_WRITES = itertools.count()
_IN_FLIGHT: set[Path] = set()  # this process's temporaries not yet replaced or removed
STALE_AFTER_S = 600  # a temporary untouched this long, of a pid not running here, is a dead writer's


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` (`.<name>.tmp-<host>-<pid>-<n>`, in the same folder) to write the file at: on
    leaving the block it replaces `path`; on an error in the block it is removed and `path` is left as it was.

    A `path` that is a symbolic link is written through: the file it resolves to is replaced (its temporary beside
    that file, on its file system) and the link stays, as `open(path, "w")` would leave it; `os.replace` onto the
    link itself would have put a file in the link's place. Temporaries of `path` left by dead processes of this host
    are removed first (module docstring). An OSError about the temporary (a folder that is not there) is raised naming
    `path` instead: the temporary's name is no file the caller knows."""
    given, path = path, Path(os.path.realpath(path))
    prefix = f".{path.name}.tmp-{_HOST}-"
    _remove_stale_temporaries(path.parent, prefix)
    temporary = path.with_name(f"{prefix}{os.getpid()}-{next(_WRITES)}")
    _IN_FLIGHT.add(temporary)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException as err:
        temporary.unlink(missing_ok=True)
        if isinstance(err, OSError) and str(err.filename) == str(temporary):
            raise OSError(err.errno, err.strerror, os.fspath(given)) from err  # (OSError picks the errno's subclass)
        raise
    finally:
        _IN_FLIGHT.discard(temporary)


def _remove_stale_temporaries(folder: Path, prefix: str) -> None:
    """Removes the files `<folder>/<prefix><pid>-<n>` untouched for `STALE_AFTER_S` of processes that are gone, and
    this process's own that none of its writes holds (left by an earlier process that had the same pid)."""
    if os.name != "posix":  # os.kill(pid, 0) is no probe there (it sends CTRL_C_EVENT)
        return
    try:
        names = os.listdir(folder)
    except OSError:  # not there (the write reports it) or not listable: nothing to clean
        return
    for name in names:
        match = re.fullmatch(r"(\d+)-\d+", name[len(prefix) :]) if name.startswith(prefix) else None
        if match is None or folder / name in _IN_FLIGHT or (int(match[1]) != os.getpid() and _alive(int(match[1]))):
            continue
        with contextlib.suppress(OSError):  # removed meanwhile, or not ours to remove: the write goes on
            if time.time() - (folder / name).stat().st_mtime >= STALE_AFTER_S:
                (folder / name).unlink()


def _alive(pid: int) -> bool:
    """Whether a process `pid` may run on this host (a pid no process can have counts as alive: left alone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):  # another user's; a number beyond any pid
        return True
    return True


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Writes `data` (text as UTF-8) to `path` atomically (`atomic_path`)."""
    with atomic_path(path) as temporary:
        if isinstance(data, str):
            temporary.write_text(data, encoding="utf-8")
        else:
            temporary.write_bytes(data)


# flock's errors where a file system has no working locks (NFS without its lock service, some FUSE and Lustre mounts)
NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})


def save_figure(figure: Any, path: str | Path, **savefig: Any) -> None:
    """`figure.savefig(path, **savefig)` (a matplotlib Figure) written atomically (`write_atomic`): a kill or an error
    mid-draw leaves the old image whole, not a truncated one that a document links to. Drawn into memory in the format
    `path`'s suffix names, as savefig would take it from `path` (a temporary's name has none)."""
    image = io.BytesIO()
    figure.savefig(image, format=Path(path).suffix[1:] or None, **savefig)
    write_atomic(path, image.getvalue())


def image_name_problem(path: str | Path) -> str | None:
    """Why `save_figure` should not write to `path`, for a one-line refusal of a command's image argument before any
    work: its suffix names no format matplotlib writes (savefig refused it once the plot was drawn), or it has none
    (savefig wrote PNG bytes under that name); None where it names one, in either case."""
    from matplotlib.backend_bases import FigureCanvasBase  # (lazy: only a command that writes an image needs it)

    path, formats = Path(path), FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix[1:].lower()
    if suffix in formats:
        return None
    why = f"matplotlib cannot write .{suffix} files" if suffix else "no suffix names the image's format"
    return f"{why}; name it e.g. {path.with_suffix('.png')} (formats: {', '.join(sorted(formats))})"


def flock_path(path: str | Path, flags: int = os.O_RDONLY, *, wait: bool = False) -> int | None:
    """An open descriptor of `path` (a folder, or a file: `flags` as os.open's, e.g. `os.O_CREAT | os.O_WRONLY`)
    holding an exclusive flock on it, which closing it releases, as the process's end does however it ends. Without
    `wait`, BlockingIOError while another process holds it; flock's other errors (a file system without working
    locks: errno in `NO_LOCKS`) are raised as well, the descriptor closed. None where there is no flock (Windows):
    nothing is opened."""
    try:
        import fcntl  # POSIX: Linux (the GPU machines, CI) and macOS
    except ImportError:
        return None
    descriptor = os.open(path, flags, 0o644)  # not inherited by child processes
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


@contextlib.contextmanager
def flocked(
    path: str | Path,
    flags: int = os.O_RDONLY,
    *,
    wait: bool = False,
    unsupported: Callable[[OSError], None] | None = None,
) -> Iterator[None]:
    """`flock_path` held for the block. With `unsupported`, a file system without working locks (flock's errno in
    `NO_LOCKS`) runs the block unlocked after calling it with flock's error (to warn); without, that error is raised."""
    try:
        descriptor = flock_path(path, flags, wait=wait)
    except OSError as err:
        if unsupported is None or err.errno not in NO_LOCKS:
            raise
        unsupported(err)
        descriptor = None
    try:
        yield
    finally:
        if descriptor is not None:
            os.close(descriptor)
