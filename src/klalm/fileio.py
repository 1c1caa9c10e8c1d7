"""Writing a file atomically: to a temporary path beside it, then `os.replace`d onto it, so a reader (or a process
started after a kill mid-write) finds the old file or the new one, never a part. It guards against a process that
dies, not a machine that loses power (nothing is fsynced).

Importing it costs nothing (no klalm module, no third-party package), so any layer may use it.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` (`.<name>.<random>.tmp`, in the same folder) to write the file at: on leaving
    the block it replaces `path`; on an error in the block it is removed and `path` is left as it was."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Writes `data` (text as UTF-8) to `path` atomically (`atomic_path`)."""
    with atomic_path(path) as temporary:
        if isinstance(data, str):
            temporary.write_text(data, encoding="utf-8")
        else:
            temporary.write_bytes(data)
