"""Reading the study's JSON and YAML files: one that does not parse is a ValueError naming it (and the line), so
`klalm-study` refuses it in one line instead of a traceback that does not say which file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from klalm.errors import one_line


def _text(path: Any) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err


def read_json(path: Path) -> Any:
    """The parsed contents of a JSON file (UTF-8)."""
    text = _text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON: {err.msg}") from err


def read_yaml(path: Any) -> Any:
    """The parsed contents of a YAML file (UTF-8); `path` may also be an importlib.resources file."""
    text = _text(path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ValueError(f"{where}: not valid YAML: {getattr(err, 'problem', None) or one_line(err)}") from err
