"""An exception as the one line a console script prints (`klalm-train: <line>`): one home for every command.

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


def refuse(command: str, message: str) -> NoReturn:
    """Ends a console script with `<command>: <message>` on one line of stderr (the message's lines joined) and exit
    status 1: how every klalm command refuses bad input."""
    sys.exit(f"{command}: " + " ".join(line.strip() for line in message.splitlines() if line.strip()))
