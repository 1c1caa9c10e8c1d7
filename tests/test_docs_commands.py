"""Every `klalm-train` / `klalm-eval` command written in README.md and docs/*.md composes and passes the config checks.

Each command is taken from the shell code blocks and the inline code of the Markdown files (the launchers
`scripts/launch_torchrun.sh` and `scripts/slurm_train.sbatch` forward their arguments to klalm-train and count too),
then composed in-process as `klalm-train ... --cfg job` would compose it (sweeps expanded into their jobs) and
checked with the apps' own rules. Paths are not checked: the docs use example paths such as
`outputs/kla_45m/2026-11-29_14-00-00`. A command that changes the model is also built, on the meta device.
`klalm-prepare-data` commands are parsed with its own argument parser and their data config composed.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import hydra
import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser

from klalm.cli import PRINT_TASKS_PATH
from klalm.cli.prepare_data_args import parse_args
from klalm.config_checks import EVAL_RULES, TRAIN_RULES, check
from klalm.data.prepare import load_data_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
SHELL_FENCES = ("", "bash", "sh", "shell", "console")
# program token -> (config name, arguments it adds before the user's)
PROGRAMS = {
    "klalm-train": ("train", []),
    "klalm.train": ("train", []),  # python -m klalm.train
    "klalm-eval": ("eval", []),
    "launch_torchrun.sh": ("train", ["trainer=ddp"]),  # trainer=$TRAINER, ddp unless set
    "slurm_train.sbatch": ("train", ["trainer=ddp"]),
    "klalm-prepare-data": ("prepare-data", []),
}
HYDRA_FLAGS = {"-m", "--multirun", "--help", "-h", "--cfg", "job", "--resolve"}


def _command_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command text) of every shell line and inline code span naming a program."""
    found = []
    for match in FENCE.finditer(text):
        if match[1] not in SHELL_FENCES:
            continue
        first_line = text.count("\n", 0, match.start(2)) + 1
        joined = match[2].replace("\\\n", "  ")  # continuation lines join; keep line numbers roughly right
        for offset, line in enumerate(joined.splitlines()):
            found.append((first_line + offset, line))
    outside = FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)
    for match in INLINE.finditer(outside):
        span = match[1].replace("\n", " ")
        if len(span.split()) > 1:  # a bare program name in prose is a mention, not a command
            found.append((text.count("\n", 0, match.start()) + 1, span))
    return [(n, line) for n, line in found if any(re.search(rf"(^|[\s/]){re.escape(p)}\b", line) for p in PROGRAMS)]


def _commands(line: str) -> list[tuple[str, list[str], list[str]]]:
    """(config name, env var prefixes, Hydra arguments) of each program call in a shell line."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
    lexer.whitespace_split, lexer.commenters = True, "#"
    tokens, calls = list(lexer), []
    for start, token in enumerate(tokens):
        name = Path(token).name
        if name not in PROGRAMS:
            continue
        end = next((i for i in range(start + 1, len(tokens)) if tokens[i] in ("|", "&&", ";", "||")), len(tokens))
        env = [t for t in tokens[:start] if re.fullmatch(r"[A-Z_]+=.*", t)]
        config, extra = PROGRAMS[name]
        trainer = dict(e.split("=", 1) for e in env).get("TRAINER")
        if name == "launch_torchrun.sh" and trainer:
            extra = [f"trainer={trainer}"]
        calls.append((config, env, extra + tokens[start + 1 : end]))
    return calls


def _collect() -> list[pytest.param]:
    params = []
    for path in DOCS:
        for number, line in _command_lines(path.read_text(encoding="utf-8")):
            for config, env, args in _commands(line):
                where = f"{path.relative_to(ROOT)}:{number}"
                params.append(pytest.param(config, env, args, id=f"{where} {' '.join(args)}"[:150]))
    return params


COMMANDS = _collect()


def _jobs(args: list[str]) -> list[list[str]]:
    """The override lists of a command line: Hydra flags dropped, comma sweeps expanded into their jobs."""
    overrides = [a for a in args if a not in HYDRA_FLAGS]
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for override in parsed:
        if override.is_sweep_override():
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            choices.append([override.input_line])
    return [list(job) for job in itertools.product(*choices)]


@pytest.fixture
def compose_docs():
    with initialize_config_module("klalm.configs", version_base="1.3"):
        yield lambda name, overrides: compose(name, overrides=overrides, return_hydra_config=True)


def test_the_docs_have_commands():
    configs = [param.values[0] for param in COMMANDS]
    assert configs.count("train") >= 20 and configs.count("eval") >= 5 and configs.count("prepare-data") >= 3


@pytest.mark.parametrize(("config", "env", "args"), [c for c in COMMANDS if c.values[0] == "prepare-data"])
def test_documented_prepare_data_command_parses_and_composes(config, env, args):
    parsed = parse_args(args)
    assert load_data_config(parsed.data, parsed.override) is not None


@pytest.mark.parametrize(("config", "env", "args"), [c for c in COMMANDS if c.values[0] != "prepare-data"])
def test_documented_command_composes(compose_docs, monkeypatch, config, env, args):
    for assignment in env:
        monkeypatch.setenv(*assignment.split("=", 1))
    if args == [PRINT_TASKS_PATH] or args in (["--help"], ["-h"]):
        return  # handled before composition (tests/test_cli.py runs both)
    for overrides in _jobs(args):
        cfg = compose_docs(config, overrides)
        check(cfg, TRAIN_RULES if config == "train" else EVAL_RULES)
        if config == "train" and any(o.startswith(("model.", "model=")) for o in overrides):
            with torch.device("meta"):
                hydra.utils.instantiate(cfg.model, vocab_size=50257)
