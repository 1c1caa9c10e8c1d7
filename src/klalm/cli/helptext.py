"""`--help` of the Hydra apps, written from the comments of the config files themselves.

`configs/hydra/default.yaml` (klalm-train) and `configs/eval.yaml` (klalm-eval) set Hydra's help template to
`${klalm_help:<app>}`, a resolver registered here. Hydra resolves it on `--help` with the config composed from the
command line, so `klalm-train experiment=smoke --help` shows the smoke run's values. The text has three parts:

- the leading comment block of the app's root config (train.yaml / eval.yaml): what the app does, examples;
- the config groups of the root config's defaults list, one line per option from the first comment line of its file
  (`hydra` and options whose name starts with `_`, e.g. the shared recipe `experiment/_pretrain_45m`, are internal);
- every key of the composed config with its value and the trailing comment that explains it in the config files
  (the root file first, then the chosen option of each group, then the group's other files; the comments of
  overlays such as experiments describe their recipe, not the key, and are not used).
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

from omegaconf import DictConfig, OmegaConf

from klalm.config_checks import config_group_options

HIDDEN_GROUPS = ("hydra",)
INTERNAL_PREFIX = "_"  # option files (experiment/_pretrain_45m) and keys (_target_) a user does not pick
WIDTH = 120
COMMENT_COLUMN = 44

_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.]*):(?P<rest>.*)$")
_GLOBAL_PACKAGE = "# @package _global_"


def _configs() -> Any:
    return files("klalm.configs")


def _read(relative: str) -> str:
    return _configs().joinpath(relative).read_text(encoding="utf-8")


def leading_comment(text: str) -> list[str]:
    """The comment lines that open a YAML file (without `#`, the `@package` line and trailing blank comments)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line[1:].removeprefix(" "))
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _trailing_comment(rest: str) -> str | None:
    """The `# comment` after a YAML value, ignoring `#` inside quotes or inside a word (`a#b`)."""
    quote = None
    for i, char in enumerate(rest):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[i + 1 :].strip()
    return None


def key_comments(text: str, package: str) -> dict[str, str]:
    """{dotted key: its trailing comment} of one YAML file whose keys live under `package` ("" = the root)."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = _KEY_LINE.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        comment = _trailing_comment(match["rest"])
        if comment:
            key = ".".join([package] * bool(package) + [k for _, k in stack])
            comments[key] = comment
    return comments


def _is_overlay(text: str) -> bool:
    """An option file that writes into the root config (`# @package _global_`), e.g. an experiment."""
    return _GLOBAL_PACKAGE in text.splitlines()[:3]


def _summary(text: str) -> str:
    """The first sentence of a file's leading comment."""
    paragraph = " ".join(line.strip() for line in leading_comment(text))
    return re.split(r"(?<!e\.g\.)(?<=\.)\s", paragraph, maxsplit=1)[0].rstrip(".")


def comment_index(root: str, choices: dict[str, Any]) -> dict[str, str]:
    """{dotted key: comment} over the config files, in the order of precedence the module docstring gives."""
    layers: list[dict[str, str]] = [key_comments(_read(f"{root}.yaml"), "")]
    for group in choices:
        if group.startswith("hydra") or not _configs().joinpath(group).is_dir():
            continue
        chosen = choices[group]
        for name in sorted(config_group_options(group), key=lambda n: n != chosen):  # the chosen option first
            text = _read(f"{group}/{name}.yaml")
            if not _is_overlay(text):
                layers.append(key_comments(text, group))
    index: dict[str, str] = {}
    for layer in reversed(layers):  # earlier layers win
        index.update(layer)
    return index


def _fit(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"


def _format(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_format(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_format(v)}" for k, v in value.items()) + "}"
    return repr(value) if value == "" else str(value)


def _key_lines(node: dict[str, Any], comments: dict[str, str], prefix: str = "", depth: int = 0) -> list[str]:
    lines = []
    for key, value in node.items():
        if str(key).startswith(INTERNAL_PREFIX):
            continue
        path = f"{prefix}{key}"
        pad = "  " * (depth + 1)
        if isinstance(value, dict) and value:
            line = f"{pad}{key}:"
            children = _key_lines(value, comments, f"{path}.", depth + 1)
        else:
            line, children = f"{pad}{key}: {_format(value)}", []
        if path in comments:
            line = f"{line.ljust(COMMENT_COLUMN - 1)} # {comments[path]}"
        lines.append(_fit(line))
        lines.extend(children)
    return lines


def _group_lines(root: str, choices: dict[str, Any]) -> list[str]:
    defaults = OmegaConf.create(_read(f"{root}.yaml")).get("defaults", [])
    groups = [next(iter(entry)) for entry in defaults if isinstance(entry, DictConfig)]
    lines = []
    for group in groups:
        if group in HIDDEN_GROUPS:
            continue
        lines.append(f"  {group}:" + ("" if choices.get(group) else "  (none chosen)"))
        for name in config_group_options(group):
            if name.startswith(INTERNAL_PREFIX):
                continue
            mark = "*" if choices.get(group) == name else " "
            lines.append(_fit(f"   {mark} {name:<14} {_summary(_read(f'{group}/{name}.yaml'))}"))
    return lines


def help_text(app: str, root: str, cfg: DictConfig) -> str:
    """The `--help` text of `app` for the composed config `cfg` (with its `hydra` node), `$` escaped for Hydra."""
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices) if "hydra" in cfg else {}
    parts = ["\n".join(leading_comment(_read(f"{root}.yaml")))]
    groups = _group_lines(root, choices)
    if groups:
        parts.append("Config groups (group=option; * = chosen now):\n" + "\n".join(groups))
    body = OmegaConf.to_container(cfg, resolve=False)
    body.pop("hydra", None)
    keys = _key_lines(body, comment_index(root, choices))
    parts.append("Keys (override any as key=value; values as composed now):\n" + "\n".join(keys))
    parts.append(f"Hydra's own flags: {app} --hydra-help")
    return "\n\n".join(parts).replace("$", "$$") + "\n"


# The template of configs/hydra/default.yaml and configs/eval.yaml: ${klalm_help:klalm-train,train}.
OmegaConf.register_new_resolver(
    "klalm_help", lambda app, root, _root_: help_text(app, root, _root_), replace=True, use_cache=False
)
