"""Console scripts. Each verb maps to the function that owns it; imports are lazy so `--help` is fast."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "train": "klalm.train.app:main",
    "evaluate": "klalm.eval.app:main",
    "params": "klalm.models.presets:main",
    "lm_eval": "klalm.eval.harness:cli_main",
    "synthetic": "klalm.tasks.runner:main",
}


def _run(verb: str) -> None:
    module_name, func_name = COMMANDS[verb].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        sys.exit(f"klalm: `{verb}` is not implemented yet ({module_name} is missing)")
    getattr(module, func_name)()


def train() -> None:
    """`klalm-train`: Hydra pretraining app."""
    _run("train")


def evaluate() -> None:
    """`klalm-eval`: zero-shot lm-eval of checkpoints."""
    _run("evaluate")


def params() -> None:
    """`klalm-params`: exact parameter count of every model preset."""
    _run("params")


def lm_eval() -> None:
    """`klalm-lm-eval`: the lm-eval CLI with klalm's model classes registered."""
    _run("lm_eval")


def synthetic() -> None:
    """`klalm-synthetic`: train archs on the synthetic benchmarks (A5, MQAR, MAD) and write tables and plots."""
    _run("synthetic")
