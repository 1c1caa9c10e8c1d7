"""The study spec (configs/study/*.yaml): which models, which learning rates, what the runs cost.

Everything a study run needs beyond the Hydra experiment lives here, and every choice is checked on load so a typo
fails before a GPU is touched. Cells are named for their folders: ``<model>-s<seed>`` for runs and
``<model>-lr<lr>`` for sweep cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from klalm.config_checks import is_int, is_number
from klalm.study.files import read_yaml

DEFAULT_SPEC = "enwiki_45m"
# the spec's keys and what each must be (the checks of their contents are in `_check`)
_TYPES = {"experiment": str, "results": str, "models": dict, "seeds": list, "extra_seeds": dict, "sweep": dict,
          "eval": dict, "estimate": dict, "overrides": list, "cost": dict}  # fmt: skip
_KIND_NAMES = {str: "string", dict: "mapping", list: "list"}
# The keys `klalm.study.runner.train_overrides` sets on every cell's command, in its order, each with where the study
# takes it from: the spec's `overrides` follow them there, so one of these keys would silently replace every cell's own
# value (a train.max_tokens, the budget the study checked).
CELL_KEYS = {
    "experiment": "the spec's experiment",
    "model": "models",
    "optim.lr": "the sweep",
    "train.dynamics_lr_scale": "models.<model>.dynamics_lr_scale",
    "train.max_tokens": "one pass over the staged train split, sweep.fraction of it for a sweep cell",
    "seed": "seeds and extra_seeds",
    "run_name": "the cell's name",
    "hydra.run.dir": "the cell's run folder under --work",
}
# The trainer spans devices only as `klalm.study.runner.train_command` launches it: one GPU for a sweep cell, torchrun
# with `trainer=ddp trainer.devices=<--gpus>` after the spec's overrides for a run on several. So they may pick a
# one-device trainer (`trainer=cpu` for a rehearsal; replaced there) but neither the devices nor a trainer over several
# (configs/trainer/ddp.yaml, fsdp.yaml), which replaced the study's choice on every cell or gave a sweep cell one.
MULTI_DEVICE_TRAINERS = ("ddp", "fsdp")
DEVICE_KEYS = ("trainer.devices", "trainer.num_nodes", "trainer.strategy")  # what those trainer configs set


@dataclass(frozen=True)
class Cell:
    """One training run of the study: a model at a learning-rate source and seed, or a sweep point."""

    model: str
    seed: int
    lr: float | None = None  # set for sweep cells; runs look theirs up in the sweep results
    sweep: bool = False

    @property
    def name(self) -> str:
        return f"{self.model}-lr{self.lr:g}" if self.sweep else f"{self.model}-s{self.seed}"


@dataclass(frozen=True)
class Spec:
    """A loaded, checked study spec (field meanings in configs/study/enwiki_45m.yaml)."""

    name: str
    experiment: str
    results: Path
    models: dict[str, dict[str, Any]]
    seeds: list[int]
    extra_seeds: dict[str, list[int]]
    sweep: dict[str, Any]
    eval: dict[str, Any]
    estimate: dict[str, Any]
    overrides: list[str]
    cost: dict[str, Any]

    def run_cells(self) -> list[Cell]:
        """First seeds of every model in priority order, then the extra seeds."""
        cells = [Cell(m, s) for s in self.seeds for m in self.models]
        return cells + [Cell(m, s) for m, seeds in self.extra_seeds.items() for s in seeds]

    def sweep_cells(self) -> list[Cell]:
        return [Cell(m, self.seeds[0], float(lr), sweep=True) for m, lrs in self.sweep["lrs"].items() for lr in lrs]

    def lr_source(self, model: str) -> str:
        """The model whose sweep decides this model's learning rate."""
        source = self.models[model]["lr"]
        return model if source == "sweep" else source


_EVAL_KEYS = {"tasks", "limit", "batch_size", "val_batch_size"}
_ESTIMATE_KEYS = {"overhead_s", "eval_s", "ddp_efficiency", "prior_tokens_per_s"}


def _check_parts(spec: Spec, source: str) -> None:
    """The types and ranges inside the spec's mappings and lists (what `_check` goes on to cross-check); `source`: the
    spec's file."""
    for where, seeds in [("seeds", spec.seeds), *((f"extra_seeds.{m}", s) for m, s in spec.extra_seeds.items())]:
        if not isinstance(seeds, list) or not all(is_int(seed) for seed in seeds):
            raise ValueError(f"study {where}={seeds!r} must be a list of whole numbers")
    swept = spec.sweep.get("lrs", {})  # a missing key is `_check`'s to name
    if not isinstance(swept, dict):
        raise ValueError(f"study sweep.lrs={swept!r} must map each swept model to its learning rates")
    for model, lrs in swept.items():
        if not isinstance(lrs, list) or not lrs or not all(is_number(lr) and lr > 0 for lr in lrs):
            raise ValueError(f"study sweep.lrs.{model}={lrs!r} must be a list of positive learning rates")
    for model, options in spec.models.items():
        scale = options.get("dynamics_lr_scale") if isinstance(options, dict) else None
        if isinstance(options, dict) and "dynamics_lr_scale" in options and not (is_number(scale) and scale > 0):
            raise ValueError(f"study models.{model}.dynamics_lr_scale={scale!r} must be a positive number")
    if not all(isinstance(o, str) for o in spec.overrides):
        raise ValueError(f"study overrides={spec.overrides!r} must be a list of Hydra overrides (strings)")
    for override in spec.overrides:
        key, _, value = (part.strip() for part in override.lstrip("~+").partition("="))
        if key in CELL_KEYS:
            raise ValueError(f"study overrides: {override!r} sets {key}, which the study sets per cell (from "
                             f"{CELL_KEYS[key]})")  # fmt: skip
        if key in DEVICE_KEYS or (key == "trainer" and value in MULTI_DEVICE_TRAINERS):
            raise ValueError(f"study spec {source}: overrides: {override!r} sets {key} for every model "
                             f"({', '.join(spec.models)}), which the study sets itself: one GPU for a sweep cell, "
                             "trainer=ddp trainer.devices=<--gpus> for a run on several (a one-device trainer=cpu or "
                             "gpu may stay: the study's trainer=ddp comes after it)")  # fmt: skip
    if set(spec.eval) != _EVAL_KEYS:
        raise ValueError(f"study eval: keys must be {sorted(_EVAL_KEYS)}, got {sorted(spec.eval, key=str)}")
    tasks, limit = spec.eval["tasks"], spec.eval["limit"]
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise ValueError(f"study eval.tasks={tasks!r} must be a list of task names")
    if limit is not None and not (is_int(limit) and limit > 0):
        raise ValueError(f"study eval.limit={limit!r} must be a positive whole number, or null for every example")
    for key in ("batch_size", "val_batch_size"):
        if not (is_int(spec.eval[key]) and spec.eval[key] > 0):
            raise ValueError(f"study eval.{key}={spec.eval[key]!r} must be a positive whole number")
    if set(spec.estimate) != _ESTIMATE_KEYS:
        got = sorted(spec.estimate, key=str)
        raise ValueError(f"study estimate: keys must be {sorted(_ESTIMATE_KEYS)}, got {got}")
    for key in ("overhead_s", "eval_s"):
        if not (is_number(spec.estimate[key]) and spec.estimate[key] >= 0):
            raise ValueError(f"study estimate.{key}={spec.estimate[key]!r} must be a number of seconds (>= 0)")
    efficiency = spec.estimate["ddp_efficiency"]
    if not (is_number(efficiency) and 0 < efficiency <= 1):
        raise ValueError(f"study estimate.ddp_efficiency={efficiency!r} must be a number in (0, 1]")
    priors = spec.estimate["prior_tokens_per_s"]
    if not isinstance(priors, dict) or not all(is_number(v) and v > 0 for v in priors.values()):
        raise ValueError(f"study estimate.prior_tokens_per_s={priors!r} must map models to positive tokens/s")


def _check(spec: Spec, source: str) -> None:
    _check_parts(spec, source)
    if not spec.seeds:
        raise ValueError("study seeds: name at least one seed (the runs' first, and the sweep's)")
    if set(spec.sweep) != {"lrs", "fraction"}:
        raise ValueError(f"study sweep: keys must be fraction and lrs, got {sorted(spec.sweep, key=str)}")
    fraction = spec.sweep["fraction"]
    if not is_number(fraction) or not 0 < fraction <= 1:
        raise ValueError(f"study sweep.fraction={fraction!r} must be a number in (0, 1]")
    for model, options in spec.models.items():
        if not isinstance(options, dict) or set(options) != {"lr", "dynamics_lr_scale"}:
            got = sorted(options, key=str) if isinstance(options, dict) else options
            raise ValueError(f"study models.{model}: keys must be lr and dynamics_lr_scale, got {got!r}")
        source = spec.lr_source(model)
        if source not in spec.sweep["lrs"]:
            raise ValueError(f"study models.{model}.lr={options['lr']!r}: {source} has no sweep.lrs entry")
    for model in [*spec.extra_seeds, *spec.sweep["lrs"], *spec.estimate["prior_tokens_per_s"]]:
        if model not in spec.models:
            raise ValueError(f"study: {model!r} is used but not listed under models ({sorted(spec.models)})")
    _check_cells_once(spec)
    if set(spec.cost) != {"tokens", "gpus", "models_180m", "bench_rows"}:
        raise ValueError(f"study cost: keys must be bench_rows, gpus, models_180m and tokens, got {sorted(spec.cost)}")


def _check_cells_once(spec: Spec) -> None:
    """No cell twice: a seed or learning rate given twice (`[1.0e-3, 0.001]`, or an extra seed that `seeds` has)
    named one cell, and so one run folder, twice: the runner trained it again after it had finished, or, side by side
    on two GPUs, deleted its folder while it trained."""
    extra = [(f"extra_seeds.{model}", seeds, spec.seeds) for model, seeds in spec.extra_seeds.items()]
    for key, seeds, before in [("seeds", spec.seeds, []), *extra]:
        twice = next((seed for i, seed in enumerate(seeds) if seed in [*before, *seeds[:i]]), None)
        if twice is not None:
            why = "is in seeds already" if twice in before else "is given twice"
            raise ValueError(f"study {key}={seeds!r}: seed {twice} {why} (a cell, <model>-s{twice}, is one run "
                             "folder)")  # fmt: skip
    for model, lrs in spec.sweep["lrs"].items():
        names = [Cell(model, spec.seeds[0], float(lr), sweep=True).name for lr in lrs]
        twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if twice is not None:
            raise ValueError(f"study sweep.lrs.{model}={lrs!r} names the cell {twice} twice (a cell is one run folder)")


def available_specs() -> list[str]:
    """Names of the specs shipped in configs/study/."""
    folder = files("klalm.configs").joinpath("study")
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_spec(name_or_path: str = DEFAULT_SPEC) -> Spec:
    """A spec by name (configs/study/<name>.yaml in the installed package) or by path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FileNotFoundError(f"study spec {path} does not exist")
        source = path
    else:
        source = files("klalm.configs").joinpath("study", f"{name_or_path}.yaml")
        if not source.is_file():
            raise FileNotFoundError(f"no study spec {name_or_path!r} (configs/study/{name_or_path}.yaml); available: "
                                    f"{', '.join(available_specs())}, or a path to a .yaml file")  # fmt: skip
    raw = read_yaml(source)
    if not isinstance(raw, dict) or set(raw) != set(_TYPES):
        got = sorted(raw, key=str) if isinstance(raw, dict) else "nothing" if raw is None else f"a {type(raw).__name__}"
        raise ValueError(f"study spec {name_or_path}: keys must be {sorted(_TYPES)}, got {got}")
    for key, kind in _TYPES.items():
        if not isinstance(raw[key], kind):
            raise ValueError(f"study spec {name_or_path}: {key} must be a {_KIND_NAMES[kind]}, got {raw[key]!r}")
    spec = Spec(name=path.stem, **{**raw, "results": Path(raw["results"])})
    _check(spec, str(source))
    return spec
