"""Plans of the synthetic benchmarks: the dataclasses a plan YAML fills, the command-line knobs (parsed by
klalm.cli.synthetic_args) applied to one, and the ordered list of units (klalm.tasks.cells.Unit) a plan asks for.

A plan is a YAML file in configs/synthetic/ (`full`, `quick`, `cpu`) or a path; every key is checked against these
dataclasses (an unknown key raises KeyError naming it and the valid ones). A5 and MQAR list their work in stages,
run in order: a stage's units come before the next stage's, and within A5 a depth waits for the shallower depths
of its (arch, length) and is dropped once a shallower depth (or another seed of the same depth) solved the cell.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import itertools
import math
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from klalm.config_checks import A5_CRITERIA, MAD_TASKS
from klalm.errors import one_line
from klalm.tasks.cells import FAMILY_NAMES, TrainSettings, Unit

A5_AUX_LENGTH = 2  # SLiCE: a batch of length-2 sequences joins every A5 step


@dataclasses.dataclass
class A5Stage:
    """A5 cells of one stage: lengths x depths x the plan's archs, each with these seeds."""

    lengths: list[int]
    depths: list[int]
    seeds: list[int]


@dataclasses.dataclass
class A5Plan:
    """A5: the minimum depth per (arch, length) at which any seed reaches `threshold` held-out accuracy.

    A run stops at the first evaluation where a seed reaches the threshold (the cell is then solved).
    """

    d_model: int = 128
    criterion: str = "token"  # "token": per-token accuracy; "sequence": whole-sequence accuracy (Merrill)
    threshold: float = 0.9
    num_test: int = 2000
    eval_every: int = 1000
    stages: list[A5Stage] = dataclasses.field(default_factory=list)
    train: TrainSettings = dataclasses.field(default_factory=TrainSettings)


@dataclasses.dataclass
class MQARStage:
    """MQAR cells of one stage: archs x (length, pairs) cells x depths x widths x learning rates, with these seeds."""

    archs: list[str]
    cells: list[list[int]]
    depths: list[int]
    d_models: list[int]
    lrs: list[float]
    seeds: list[int]
    d_states: list[int] | None = None  # KLA's d_state (its key and readout dimension) for the KLA archs; None: default


@dataclasses.dataclass
class MQARPlan:
    """MQAR: held-out accuracy at the query positions; the best learning rate of each cell is reported.

    With `stop_at`, a run stops at the first evaluation (every `eval_every` steps) where its accuracy reaches it, as
    Zoology's trainer stops at 99 % validation accuracy; its row then holds that evaluation's accuracy.
    """

    vocab: int = 8192
    num_train: int = 100_000
    num_test: int = 3_000
    eval_every: int | None = None
    stop_at: float | None = None
    stages: list[MQARStage] = dataclasses.field(default_factory=list)
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
    eval_every: int | None = None
    train: TrainSettings = dataclasses.field(default_factory=TrainSettings)


@dataclasses.dataclass
class Estimate:
    """The prior of the runner's time estimates, used until this device has measured a unit of the same kind."""

    tokens_per_s: dict[str, float] = dataclasses.field(default_factory=dict)  # arch -> one block, one seed
    overhead_s: float = 40.0  # per unit: process start, data, build, warm-up, capture, final evaluation
    safety: float = 1.15  # estimates are multiplied by this


@dataclasses.dataclass
class RunPlan:
    """Everything one invocation may run, and how."""

    archs: list[str] = dataclasses.field(default_factory=lambda: ["kla", "gpt", "mamba", "gdn"])
    families: list[str] = dataclasses.field(default_factory=lambda: list(FAMILY_NAMES))
    time_budget_s: float | None = None  # wall-clock budget of one invocation; units that would end later wait
    device: str = "auto"  # auto: cuda if available, else cpu
    members: int = 1  # seeds trained side by side in one process (one CUDA graph)
    procs_per_gpu: int = 1  # units running at once on each GPU, one process each
    units_per_process: int = 1  # units of one pack_key (an lr sweep) trained side by side in one process
    max_state_mib: float | None = None  # a pack's paused states stay under this (they travel between GPU blocks)
    compile_backend: str | None = None  # torch.compile backend of the captured step on CUDA (None: eager)
    deterministic: bool = False  # torch.use_deterministic_algorithms in every unit (bit-reproducible on a GPU, slower)
    model_overrides: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # arch -> build_model kwargs
    estimate: Estimate = dataclasses.field(default_factory=Estimate)
    a5: A5Plan = dataclasses.field(default_factory=A5Plan)
    mqar: MQARPlan = dataclasses.field(default_factory=MQARPlan)
    mad: MADPlan = dataclasses.field(default_factory=MADPlan)


_NESTED = {"train": TrainSettings, "a5": A5Plan, "mqar": MQARPlan, "mad": MADPlan, "estimate": Estimate}
_STAGES = {"a5": A5Stage, "mqar": MQARStage}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a value read from YAML has the type of a plan field (an int passes for a float, a bool for nothing
    else, a list for a tuple)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint in (int, float, str, bool):
        if isinstance(value, bool):
            return hint is bool
        return isinstance(value, (int, float) if hint is float else hint)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args, strict=True))
        return not args or all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    return True


def _type_name(hint: Any) -> str:
    """ "int", "list[int]", "float | None": a plan field's type as its annotation spells it."""
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "").replace("NoneType", "None")


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    """A plan dataclass from a dict; unknown or missing keys raise KeyError naming them and the valid ones, a value of
    the wrong type ValueError naming its key."""
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a mapping of {cls.__name__}'s keys, got {values!r}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise KeyError(f"unknown keys {unknown} in {where}; valid: {sorted(names)}")
    required = [n for n, f in names.items() if f.default is f.default_factory is dataclasses.MISSING]
    missing = sorted(set(required) - set(values))
    if missing:
        raise KeyError(f"missing keys {missing} in {where}")
    kwargs = {}
    for key, value in values.items():
        if key in _NESTED:
            value = _build(_NESTED[key], value, f"{where}.{key}")
        elif key == "stages":
            if not isinstance(value, list):
                raise ValueError(f"{where}.stages must be a list of stages, got {value!r}")
            family = where.rsplit(".", 1)[-1]
            value = [_build(_STAGES[family], stage, f"{where}.stages[{i}]") for i, stage in enumerate(value)]
        elif not _fits(value, hints[key]):
            raise ValueError(f"{where}.{key}={value!r} must be {_type_name(hints[key])}")
        kwargs[key] = value
    return cls(**kwargs)


def plan_dir() -> Path:
    return Path(str(resources.files("klalm.configs") / "synthetic"))


def load_plan(name: str) -> RunPlan:
    """The RunPlan of a plan name (configs/synthetic/<name>.yaml) or of a YAML path; a folder, or a file that sets no
    key, is refused (every key has a default: an empty file would read as a plan with no stages and no priors)."""
    path = Path(name) if Path(name).suffix else plan_dir() / f"{name}.yaml"
    if not path.is_file():
        if Path(name).is_dir():
            raise IsADirectoryError(f"plan {name!r} is a folder, not a plan YAML file")
        names = sorted(p.stem for p in plan_dir().glob("*.yaml"))
        raise FileNotFoundError(f"plan {name!r}: no file {path}; plans: {names}, or a YAML path")
    try:
        values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except (yaml.YAMLError, OmegaConfBaseException) as err:  # YAML syntax, an interpolation that does not resolve
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ValueError(f"plan {where}: {getattr(err, 'problem', None) or one_line(err)}") from err
    if values == {}:
        raise ValueError(f"plan {path} is empty: it sets no key (examples: {plan_dir()}/*.yaml)")
    return _build(RunPlan, values, str(path))


# ------------------------------------------------------------------------------------------------- units of a plan


def _seed_groups(seeds: list[int], members: int) -> list[list[int]]:
    return [seeds[i : i + members] for i in range(0, len(seeds), members)]


def a5_units(plan: RunPlan) -> list[Unit]:
    """Stage by stage; within a stage length by length, depth by depth, arch by arch."""
    a5, units = plan.a5, []
    aux = {"name": "a5", "length": A5_AUX_LENGTH} if a5.train.aux_batch_size > 0 else None
    stop = {"metric": A5_CRITERIA[a5.criterion], "threshold": a5.threshold}
    for stage in a5.stages:
        for length, depth, arch in itertools.product(stage.lengths, stage.depths, plan.archs):
            for seeds in _seed_groups(stage.seeds, plan.members):
                task = {"name": "a5", "length": length}
                units.append(Unit("a5", task, arch, depth, a5.d_model, plan.model_overrides.get(arch, {}), a5.train,
                                  seeds, a5.num_test, None, aux, a5.eval_every, stop))  # fmt: skip
    return units


def mqar_units(plan: RunPlan) -> list[Unit]:
    """Stage by stage; within a stage cell by cell, then depth, width, arch, learning rate."""
    mqar, units = plan.mqar, []
    stop = None if mqar.stop_at is None else {"metric": "token_acc", "threshold": mqar.stop_at}
    for stage in mqar.stages:
        archs = [a for a in stage.archs if a in plan.archs]
        for (length, pairs), depth, d_model, arch, lr in itertools.product(
            stage.cells, stage.depths, stage.d_models, archs, stage.lrs
        ):
            task = {"name": "mqar", "length": length, "num_pairs": pairs, "vocab": mqar.vocab}
            train = dataclasses.replace(mqar.train, lr=lr)
            d_states = (stage.d_states or [None]) if "kla" in arch.split("_") else [None]  # kla, gpt_kla
            for d_state, seeds in itertools.product(d_states, _seed_groups(stage.seeds, plan.members)):
                overrides = with_kla_d_state(plan.model_overrides.get(arch, {}), d_state)
                units.append(Unit("mqar", task, arch, depth, d_model, overrides, train, seeds,
                                  mqar.num_test, mqar.num_train, None, mqar.eval_every, stop))  # fmt: skip
    return units


@functools.cache
def kla_default_d_state() -> int:
    """The KLA mixer's d_state when nothing sets it."""
    from klalm.models.mixers.kla import KLAMixer  # lazy, as the model zoo in `validate`

    return inspect.signature(KLAMixer).parameters["d_state"].default


def with_kla_d_state(overrides: dict[str, Any], d_state: int | None) -> dict[str, Any]:
    """An arch's build_model overrides with the KLA mixer's d_state set. Unchanged for None, and for the layer's
    default where the overrides do not set another: spelling the default out names the same unit (and results)."""
    options = overrides.get("mixer_options", {})
    if d_state is None or (d_state == kla_default_d_state() and "d_state" not in options.get("kla", {})):
        return overrides
    return {**overrides, "mixer_options": {**options, "kla": {**options.get("kla", {}), "d_state": d_state}}}


def mad_units(plan: RunPlan) -> list[Unit]:
    """Task by task; then learning rate, weight decay, arch."""
    from klalm.tasks.registry import make_task  # lazy: torch, which `positions` and `curves` (via report) do without

    mad, units = plan.mad, []
    for name in mad.tasks:
        settings = mad.task_settings.get(name, {})
        task = make_task(name, **settings)
        num_train = min(task.num_train, mad.max_train or task.num_train)
        num_test = min(task.num_test, mad.max_test or task.num_test)
        steps = mad.train.steps if mad.epochs is None else math.ceil(mad.epochs * num_train / mad.train.batch_size)
        for lr, weight_decay, arch in itertools.product(mad.lrs, mad.weight_decays, plan.archs):
            train = dataclasses.replace(mad.train, lr=lr, weight_decay=weight_decay, steps=steps)
            for seeds in _seed_groups(mad.seeds, plan.members):
                units.append(Unit("mad", {"name": name, **settings}, arch, mad.n_layers, mad.d_model,
                                  plan.model_overrides.get(arch, {}), train, seeds, num_test, num_train, None,
                                  mad.eval_every))  # fmt: skip
    return units


FAMILIES = {"a5": a5_units, "mqar": mqar_units, "mad": mad_units}


def plan_units(plan: RunPlan) -> list[Unit]:
    """Every unit of the plan's families in priority order; a unit listed twice (by overlapping stages) once."""
    units, seen = [], set()
    for family in plan.families:
        for unit in FAMILIES[family](plan):
            key = tuple(unit.key(seed) for seed in unit.seeds)
            if key not in seen:
                unit.train.schedule()  # raises ValueError on a bad lr / warmup before anything runs
                seen.add(key)
                units.append(unit)
    return units


# ------------------------------------------------------------------------------------------------- command line


def apply_args(plan: RunPlan, args: argparse.Namespace) -> RunPlan:
    """Command-line knobs on top of a plan; then `validate`. A list knob that names nothing (`--archs ""`: an unset
    shell variable, say) raises ValueError naming it, instead of planning no units."""
    empty = _list_knobs(args)
    if empty:
        raise ValueError(f"{empty[0]} names nothing: give at least one comma-separated value")
    for name in ("device", "members", "procs_per_gpu", "units_per_process", "max_state_mib", "deterministic"):
        if getattr(args, name) is not None:
            setattr(plan, name, getattr(args, name))
    if args.compile_backend is not None:
        plan.compile_backend = None if args.compile_backend == "none" else args.compile_backend
    if args.archs is not None:
        plan.archs = args.archs
    if args.families is not None:
        plan.families = args.families
    if args.steps is not None:
        for family in (plan.a5, plan.mqar, plan.mad):
            family.train.steps = args.steps
        plan.mad.epochs = None
    stage_knobs = {
        "seeds": [*plan.a5.stages, *plan.mqar.stages, plan.mad],
        "a5_lengths": plan.a5.stages,
        "a5_depths": plan.a5.stages,
        "mqar_cells": plan.mqar.stages,
        "mqar_depths": plan.mqar.stages,
        "mqar_d_models": plan.mqar.stages,
        "mqar_d_states": plan.mqar.stages,
        "lrs": [*plan.mqar.stages, plan.mad],
        "mad_weight_decays": [plan.mad],
    }
    for knob, targets in stage_knobs.items():
        value = getattr(args, knob)
        if value is None:
            continue
        field = knob.removeprefix("a5_").removeprefix("mqar_").removeprefix("mad_")
        for target in targets:
            setattr(target, field, list(value))
    if args.a5_criterion is not None:
        plan.a5.criterion = args.a5_criterion
    if args.mad_tasks is not None:
        plan.mad.tasks = args.mad_tasks
    validate(plan)
    return plan


def _list_knobs(args: argparse.Namespace) -> list[str]:
    """The list knobs given on the command line with no item ("" or ",")."""
    knobs = ("archs", "families", "seeds", "lrs", "a5_lengths", "a5_depths", "mqar_cells", "mqar_depths",
             "mqar_d_models", "mqar_d_states", "mad_tasks", "mad_weight_decays")  # fmt: skip
    return ["--" + knob.replace("_", "-") for knob in knobs if getattr(args, knob, None) == []]


def validate(plan: RunPlan) -> None:
    """Fail before any training on names and values that cannot run."""
    from klalm.models import ARCH_LAYOUTS

    mqar_archs = [a for stage in plan.mqar.stages for a in stage.archs]
    checks = {
        "archs": (plan.archs, ARCH_LAYOUTS),
        "mqar.stages[].archs": (mqar_archs, ARCH_LAYOUTS),
        "families": (plan.families, FAMILY_NAMES),
        "mad.tasks": (plan.mad.tasks, MAD_TASKS),
        "mad.task_settings": (list(plan.mad.task_settings), MAD_TASKS),
        "a5.criterion": ([plan.a5.criterion], A5_CRITERIA),
        "model_overrides": (list(plan.model_overrides), ARCH_LAYOUTS),
        "estimate.tokens_per_s": (list(plan.estimate.tokens_per_s), ARCH_LAYOUTS),
    }
    if plan.compile_backend is not None:
        import torch._dynamo  # lazy, as the model zoo above

        checks["compile_backend"] = ([plan.compile_backend], torch._dynamo.list_backends(exclude_tags=()))
    for key, (values, valid) in checks.items():
        bad = [v for v in values if v not in valid]
        if bad:
            raise KeyError(f"{key}: unknown {bad}; valid: {sorted(valid)}")
    for key in ("members", "procs_per_gpu", "units_per_process"):
        if getattr(plan, key) < 1:
            raise ValueError(f"{key}={getattr(plan, key)} must be >= 1")
    if plan.max_state_mib is not None and not 0 < plan.max_state_mib < math.inf:
        raise ValueError(f"max_state_mib={plan.max_state_mib} must be > 0 (MiB)")
    if plan.time_budget_s is not None and not 0 < plan.time_budget_s < math.inf:
        raise ValueError(f"time_budget_s={plan.time_budget_s} must be > 0 (null: no deadline)")
    for family in ("a5", "mqar", "mad"):
        steps = getattr(plan, family).train.steps
        if family in plan.families and steps < 1 and (family != "mad" or plan.mad.epochs is None):
            raise ValueError(f"{family}.train.steps={steps} must be >= 1 (--steps sets every family's)")
    if "mad" in plan.families and plan.mad.epochs is not None and not 0 < plan.mad.epochs < math.inf:
        raise ValueError(f"mad.epochs={plan.mad.epochs} must be > 0 (null: train.steps)")
    if plan.mqar.stop_at is not None and not 0 < plan.mqar.stop_at <= 1:
        raise ValueError(f"mqar.stop_at={plan.mqar.stop_at} is an accuracy: it must be in (0, 1]")
    if plan.mqar.stop_at is not None and not plan.mqar.eval_every:
        raise ValueError(f"mqar.stop_at={plan.mqar.stop_at} needs mqar.eval_every (the evaluations it stops at)")
    for i, stage in enumerate(plan.a5.stages):
        if any(n < 1 for n in stage.lengths) or any(d < 1 for d in stage.depths):
            raise ValueError(f"a5.stages[{i}]: lengths and depths must be >= 1, got {stage.lengths}, {stage.depths}")
    for i, stage in enumerate(plan.mqar.stages):
        _validate_mqar_stage(f"mqar.stages[{i}]", stage, plan.mqar.vocab)
    seeds = {f"{family}.stages[{i}].seeds": stage.seeds for family in ("a5", "mqar")
             for i, stage in enumerate(getattr(plan, family).stages)}  # fmt: skip
    seeds["mad.seeds"] = plan.mad.seeds
    for key, values in seeds.items():
        if any(seed < 0 for seed in values):
            raise ValueError(f"{key}: seeds must be >= 0, got {values}")
        if len(set(values)) < len(values):  # with members > 1 one unit trained it twice and wrote its row twice
            raise ValueError(f"{key}: a seed is listed twice, got {values}")
    lrs = {f"mqar.stages[{i}].lrs": stage.lrs for i, stage in enumerate(plan.mqar.stages)} | {"mad.lrs": plan.mad.lrs}
    for key, values in lrs.items():
        if any(lr <= 0 for lr in values):
            raise ValueError(f"{key}: learning rates must be > 0, got {values}")
        if not all(math.isfinite(lr) for lr in values):
            raise ValueError(f"{key}: learning rates must be finite, got {values}")
    if any(wd < 0 for wd in plan.mad.weight_decays):
        raise ValueError(f"mad.weight_decays must be >= 0, got {plan.mad.weight_decays}")
    if not all(math.isfinite(wd) for wd in plan.mad.weight_decays):
        raise ValueError(f"mad.weight_decays must be finite, got {plan.mad.weight_decays}")


def _validate_mqar_stage(where: str, stage: MQARStage, vocab: int) -> None:
    """An MQAR stage's cells (each a task that can be built), depths, widths and KLA d_states (its learning rates are
    checked with the rest of each unit's training settings)."""
    from klalm.kernels.mobius_scan import MAX_STATE_SIZE  # lazy, as the model zoo in `validate`
    from klalm.tasks.registry import make_task  # lazy, as in `mad_units`

    for cell in stage.cells:
        if len(cell) != 2:
            raise ValueError(f"{where}.cells: each cell is [length, pairs], got {cell}")
        try:
            make_task("mqar", length=cell[0], num_pairs=cell[1], vocab=vocab)
        except ValueError as err:
            raise ValueError(f"{where}.cells: {err}") from None
    for key in ("depths", "d_models"):
        if any(v < 1 for v in getattr(stage, key)):
            raise ValueError(f"{where}.{key} must be >= 1, got {getattr(stage, key)}")
    if stage.d_states and any(not 1 <= d <= MAX_STATE_SIZE for d in stage.d_states):
        raise ValueError(f"{where}.d_states must be in [1, {MAX_STATE_SIZE}] (the Triton KLA scan's), "
                         f"got {stage.d_states}")  # fmt: skip
