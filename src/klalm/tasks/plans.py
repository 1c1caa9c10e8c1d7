"""Plans of the synthetic-benchmark runner: the dataclasses a budget YAML fills, and the command-line knobs.

A budget is a YAML file in configs/synthetic/ (`quick`, `full`, `cpu`) or a path; every key is checked against these
dataclasses (an unknown key raises KeyError naming it), and the command-line knobs of `parse_args` override it.
"""

from __future__ import annotations

import argparse
import dataclasses
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from klalm.tasks import MAD_TASKS
from klalm.tasks.train import TrainSettings

FAMILY_NAMES = ("a5", "mqar", "mad")


@dataclasses.dataclass
class A5Plan:
    """A5 grid: lengths x depths (tried in increasing order) x seeds, at width d_model."""

    d_model: int = 128
    lengths: list[int] = dataclasses.field(default_factory=lambda: list(range(3, 21)))
    depths: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 3, 4])
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2, 3, 4])
    criterion: str = "token"  # "token": per-token accuracy; "sequence": whole-sequence accuracy (Merrill)
    threshold: float = 0.9
    num_test: int = 2000
    train: TrainSettings = dataclasses.field(default_factory=TrainSettings)


@dataclasses.dataclass
class MQARPlan:
    """MQAR grid: (length, pairs) cells x learning rates x seeds; the best lr is reported."""

    d_model: int = 128
    n_layers: int = 2
    vocab: int = 8192
    cells: list[list[int]] = dataclasses.field(default_factory=lambda: [[64, 4], [128, 8], [256, 16], [512, 64]])
    lrs: list[float] = dataclasses.field(default_factory=lambda: [1e-4, 4.6e-4, 2.2e-3, 1e-2])
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0])
    num_train: int = 100_000
    num_test: int = 3_000
    train: TrainSettings = dataclasses.field(default_factory=TrainSettings)


@dataclasses.dataclass
class MADPlan:
    """MAD: tasks x learning rates x weight decays x seeds; the best setting is reported."""

    d_model: int = 128
    n_layers: int = 2
    tasks: list[str] = dataclasses.field(default_factory=lambda: list(MAD_TASKS))
    lrs: list[float] = dataclasses.field(default_factory=lambda: [1e-4, 5e-4, 1e-3])
    weight_decays: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.1])
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0])
    task_settings: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # task -> field overrides
    max_train: int | None = None  # cap on each task's training-set size (None: MAD's sizes)
    max_test: int | None = None  # cap on each task's test-set size (None: MAD's 1,280)
    epochs: float | None = 200  # steps = epochs x train size / batch size (None: train.steps)
    train: TrainSettings = dataclasses.field(default_factory=TrainSettings)


@dataclasses.dataclass
class RunPlan:
    """Everything one invocation runs."""

    archs: list[str] = dataclasses.field(default_factory=lambda: ["kla", "gpt", "mamba", "gdn"])
    families: list[str] = dataclasses.field(default_factory=lambda: ["a5", "mqar", "mad"])
    time_budget_s: float | None = None
    device: str = "auto"
    model_overrides: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # arch -> build_model kwargs
    a5: A5Plan = dataclasses.field(default_factory=A5Plan)
    mqar: MQARPlan = dataclasses.field(default_factory=MQARPlan)
    mad: MADPlan = dataclasses.field(default_factory=MADPlan)


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    """A plan dataclass from a dict; unknown keys raise KeyError naming them and the valid ones."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise KeyError(f"unknown keys {unknown} in {where}; valid: {sorted(names)}")
    nested = {"train": TrainSettings, "a5": A5Plan, "mqar": MQARPlan, "mad": MADPlan}
    kwargs = {
        key: _build(nested[key], value, f"{where}.{key}") if key in nested else value for key, value in values.items()
    }
    return cls(**kwargs)


def load_plan(budget: str) -> RunPlan:
    """The RunPlan of a budget name (configs/synthetic/<name>.yaml) or of a YAML path."""
    path = Path(budget)
    if not path.suffix:
        path = Path(str(resources.files("klalm.configs") / "synthetic" / f"{budget}.yaml"))
    if not path.is_file():
        names = sorted(p.stem for p in Path(str(resources.files("klalm.configs") / "synthetic")).glob("*.yaml"))
        raise FileNotFoundError(f"budget {budget!r}: no file {path}; budgets: {names}, or a YAML path")
    return _build(RunPlan, OmegaConf.to_container(OmegaConf.load(path), resolve=True), str(path))


def count_runs(plan: RunPlan) -> int:
    """Runs a plan makes at most (A5 cells stop early when solved)."""
    per_family = {
        "a5": len(plan.a5.lengths) * len(plan.a5.depths) * len(plan.a5.seeds),
        "mqar": len(plan.mqar.cells) * len(plan.mqar.lrs) * len(plan.mqar.seeds),
        "mad": len(plan.mad.tasks) * len(plan.mad.lrs) * len(plan.mad.weight_decays) * len(plan.mad.seeds),
    }
    return len(plan.archs) * sum(per_family[f] for f in plan.families)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _cells(text: str) -> list[list[int]]:
    """ "64x4,128x8" -> [[64, 4], [128, 8]]."""
    try:
        return [[int(v) for v in cell.split("x")] for cell in text.split(",") if cell]
    except ValueError as err:
        raise ValueError(f"--mqar-cells wants LENGTHxPAIRS items like 64x4,128x8; got {text!r}") from err


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train archs on the synthetic benchmarks; write tables and plots.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--out", required=True, type=Path, help="output directory (results.json, results.md, PNGs)")
    p.add_argument("--budget", default="full", help="configs/synthetic/<name>.yaml (quick, full) or a YAML path")
    p.add_argument("--archs", help="comma-separated archs for build_model, e.g. kla,gpt,mamba,gdn,gpt_kla")
    p.add_argument("--families", help="comma-separated subset of a5,mqar,mad")
    p.add_argument("--steps", type=int, help="max optimiser steps of every run (MAD: replaces epochs)")
    p.add_argument("--seeds", type=_ints, help="seeds of every family, e.g. 0,1,2")
    p.add_argument("--lrs", help="learning rates of mqar and mad, e.g. 1e-3,3e-3")
    p.add_argument("--time-budget-s", type=float, help="wall-clock budget of the whole run, seconds (0: none)")
    p.add_argument("--device", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--a5-lengths", type=_ints, help="A5 sequence lengths, e.g. 4,8,16")
    p.add_argument("--a5-depths", type=_ints, help="A5 depths to try in increasing order, e.g. 1,2,3,4")
    p.add_argument("--a5-criterion", choices=["token", "sequence"], help="A5 'solved' metric")
    p.add_argument("--mqar-cells", type=_cells, help="MQAR LENGTHxPAIRS cells, e.g. 64x4,128x8,256x16")
    p.add_argument("--mad-tasks", help=f"comma-separated subset of {','.join(MAD_TASKS)}")
    return p.parse_args(argv)


def apply_args(plan: RunPlan, args: argparse.Namespace) -> RunPlan:
    """Command-line knobs on top of a budget's plan."""
    if args.archs is not None:
        plan.archs = args.archs.split(",")
    if args.families is not None:
        plan.families = args.families.split(",")
    if args.device is not None:
        plan.device = args.device
    if args.time_budget_s is not None:
        plan.time_budget_s = args.time_budget_s or None
    for family in (plan.a5, plan.mqar, plan.mad):
        if args.steps is not None:
            family.train.steps = args.steps
        if args.seeds is not None:
            family.seeds = args.seeds
    if args.steps is not None:
        plan.mad.epochs = None
    if args.lrs is not None:
        plan.mqar.lrs = plan.mad.lrs = [float(x) for x in args.lrs.split(",")]
    knobs = {
        "a5_lengths": (plan.a5, "lengths"),
        "a5_depths": (plan.a5, "depths"),
        "a5_criterion": (plan.a5, "criterion"),
        "mqar_cells": (plan.mqar, "cells"),
    }
    for arg, (target, field) in knobs.items():
        if getattr(args, arg) is not None:
            setattr(target, field, getattr(args, arg))
    if args.mad_tasks is not None:
        plan.mad.tasks = args.mad_tasks.split(",")
    validate(plan)
    return plan


def validate(plan: RunPlan) -> None:
    """Fail before any training on names that cannot run."""
    from klalm.models import ARCH_LAYOUTS

    checks = {
        "archs": (plan.archs, ARCH_LAYOUTS),
        "families": (plan.families, FAMILY_NAMES),
        "mad.tasks": (plan.mad.tasks, MAD_TASKS),
        "mad.task_settings": (list(plan.mad.task_settings), MAD_TASKS),
        "a5.criterion": ([plan.a5.criterion], ("token", "sequence")),
    }
    for key, (values, valid) in checks.items():
        bad = [v for v in values if v not in valid]
        if bad:
            raise KeyError(f"{key}: unknown {bad}; valid: {sorted(valid)}")
    if sorted(plan.a5.depths) != list(plan.a5.depths):
        raise ValueError(f"a5.depths must be increasing, got {plan.a5.depths}")
