"""An exception as the one line a console script prints (`klalm-train: <line>`): one home for every command, also of
the hint a bad record's error ends with, which each command words in its own terms.

Importing it costs nothing (no klalm module, no third-party package), so any layer may use it.
"""

from __future__ import annotations

import re
import sys
from typing import NoReturn


def one_line(err: BaseException) -> str:
    """An error's message on one line: its first non-empty line (a KeyError's key without the quotes `str` adds), or
    for an error a DataLoader worker raised (re-raised in the main process as "Caught X in DataLoader worker process
    N." and the worker's traceback) the traceback's last line; the error's type name when it has no message."""
    text = err.args[0] if isinstance(err, KeyError) and err.args and isinstance(err.args[0], str) else str(err)
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(err).__name__]
    if lines[0].startswith("Caught ") and len(lines) > 1:  # "klalm.data.records.BadRecordError: bad record at ..."
        return re.sub(r"^[\w.]*(Error|Exception): ", "", lines[-1])
    return lines[0]


def refuse(command: str, message: str, status: int = 1) -> NoReturn:
    """Ends a console script with `<command>: <message>` on one line of stderr (the message's lines joined) and exit
    status 1: how every klalm command refuses bad input; another `status` for another end (130: stopped by Ctrl-C)."""
    line = f"{command}: " + " ".join(part.strip() for part in message.splitlines() if part.strip())
    if status == 1:
        sys.exit(line)
    print(line, file=sys.stderr)
    sys.exit(status)


PYTHON_SKIP = "on_bad_record='skip'"  # the setting that skips bad records, as the Python API spells it


def skip_hint(setting: str = PYTHON_SKIP) -> str:
    """How the error of a bad record (`klalm.data.records.BadRecordError`) ends: the setting that skips and counts
    such records instead."""
    return f"(set {setting} to skip and count such records)"


def in_command_terms(message: str, setting: str) -> str:
    """A command's one line with a bad record's hint naming `setting`, the command's own spelling of it
    (``data.on_bad_record=skip`` for `klalm-train`), instead of the Python argument; any other line as it is."""
    python = skip_hint()
    return message.removesuffix(python) + skip_hint(setting) if message.endswith(python) else message
