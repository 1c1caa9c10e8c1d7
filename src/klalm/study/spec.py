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

from klalm.study.files import read_yaml

DEFAULT_SPEC = "enwiki_45m"
# the spec's keys and what each must be (the checks of their contents are in `_check`)
_TYPES = {"experiment": str, "results": str, "models": dict, "seeds": list, "extra_seeds": dict, "sweep": dict,
          "eval": dict, "estimate": dict, "overrides": list, "cost": dict}  # fmt: skip
_KIND_NAMES = {str: "string", dict: "mapping", list: "list"}


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


def _check(spec: Spec) -> None:
    if not spec.seeds:
        raise ValueError("study seeds: name at least one seed (the runs' first, and the sweep's)")
    if set(spec.sweep) != {"lrs", "fraction"}:
        raise ValueError(f"study sweep: keys must be fraction and lrs, got {sorted(spec.sweep, key=str)}")
    fraction = spec.sweep["fraction"]
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
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
    if set(spec.cost) != {"tokens", "gpus", "models_180m", "bench_rows"}:
        raise ValueError(f"study cost: keys must be bench_rows, gpus, models_180m and tokens, got {sorted(spec.cost)}")


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
        raw = read_yaml(path)
    else:
        resource = files("klalm.configs").joinpath("study", f"{name_or_path}.yaml")
        if not resource.is_file():
            raise FileNotFoundError(f"no study spec {name_or_path!r} (configs/study/{name_or_path}.yaml); available: "
                                    f"{', '.join(available_specs())}, or a path to a .yaml file")  # fmt: skip
        raw = read_yaml(resource)
    if not isinstance(raw, dict) or set(raw) != set(_TYPES):
        got = sorted(raw, key=str) if isinstance(raw, dict) else "nothing" if raw is None else f"a {type(raw).__name__}"
        raise ValueError(f"study spec {name_or_path}: keys must be {sorted(_TYPES)}, got {got}")
    for key, kind in _TYPES.items():
        if not isinstance(raw[key], kind):
            raise ValueError(f"study spec {name_or_path}: {key} must be a {_KIND_NAMES[kind]}, got {raw[key]!r}")
    spec = Spec(name=path.stem, **{**raw, "results": Path(raw["results"])})
    _check(spec)
    return spec
