"""A unit of synthetic work as data: one cell (task, arch, depth, width, recipe) and the seeds trained on it side by
side, and the identity of the result rows it gives (klalm.tasks.units runs it).

Every seed of a unit gives one result row: the cell's fields, the seed, the held-out accuracies and how the run
went. A row's key (`row_key`) is its cell plus its seed, so a finished (task, arch, length, depth, seed) is found
again whatever unit it ran in.

Nothing here imports torch: the verbs of `klalm-synthetic` that only read and write results files (merge) key their
rows with it. Only `Unit.tokens_per_step` builds the unit's task (klalm.tasks.registry, torch), when it is called.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from klalm.config_checks import check_schedule, warmup_steps_of

FAMILY_NAMES = ("a5", "mqar", "mad")  # a unit's family: which results file its rows go to


@dataclasses.dataclass
class TrainSettings:
    """Optimisation settings of one run.

    Args:
        steps: optimiser steps (fewer when the run stops early at its accuracy threshold).
        batch_size: sequences per step.
        lr: peak learning rate.
        min_lr: learning rate at the end of the cosine (absolute; the schedule's min_lr_ratio is min_lr / lr).
        warmup: linear warmup: a fraction of `steps` if < 1, else a step count (the scheduler config's `warmup`).
        weight_decay: AdamW decoupled weight decay of the "decay" group (klalm.train.optim.classify_parameters:
            matrices, not embeddings, norms, biases or parameters marked `_no_weight_decay`).
        betas: AdamW's moment decay rates.
        eps: AdamW's denominator epsilon.
        grad_clip: global gradient-norm clip (0 disables).
        aux_batch_size: A5 only: sequences of length 2 added at every step (SLiCE); 0 disables.
        eval_batch_size: sequences per evaluation forward.
    """

    steps: int = 1000
    batch_size: int = 64
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup: float = 0.1
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    grad_clip: float = 1.0
    aux_batch_size: int = 0
    eval_batch_size: int = 256

    def schedule(self) -> dict[str, float]:
        """Keyword arguments of `cosine_multiplier(_tensor)`; raises ValueError naming a bad setting."""
        if self.lr <= 0 or not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"train.lr={self.lr} must be > 0 and train.min_lr={self.min_lr} in [0, lr]")
        warmup_steps = warmup_steps_of(self.warmup, self.steps)
        check_schedule(self.steps, warmup_steps, self.min_lr / self.lr, warmup_key="train.warmup")
        return {"warmup_steps": warmup_steps, "total_steps": self.steps, "min_lr_ratio": self.min_lr / self.lr}


def kla_d_state(model_overrides: dict[str, Any]) -> int | None:
    """The KLA mixer's d_state set in an arch's build_model overrides (a unit's or a results row's), else None."""
    return model_overrides.get("mixer_options", {}).get("kla", {}).get("d_state")


@dataclasses.dataclass
class Unit:
    """One cell and the seeds trained together on it.

    Args:
        family: "a5", "mqar" or "mad" (which results file its rows go to).
        task: make_task's name and settings, e.g. {"name": "a5", "length": 12}.
        arch: build_model's arch.
        n_layers: blocks (the depth of the A5 figure).
        d_model: width.
        model_overrides: further build_model keyword arguments of this arch (e.g. the KLA block).
        train: optimisation settings.
        seeds: one member per seed (model init and data order).
        num_test: held-out examples (split "test" under units.DATA_SEED).
        num_train: size of the fixed training split (under units.DATA_SEED); None: fresh batches at every step (A5).
        aux_task: A5: make_task spec of the auxiliary batch (length 2), train.aux_batch_size sequences per step.
        eval_every: steps between held-out evaluations (None: at the end only).
        stop: stop early when a member's metric reaches a threshold: {"metric": ..., "threshold": ...}.
    """

    family: str
    task: dict[str, Any]
    arch: str
    n_layers: int
    d_model: int
    model_overrides: dict[str, Any]
    train: TrainSettings
    seeds: list[int]
    num_test: int
    num_train: int | None = None
    aux_task: dict[str, Any] | None = None
    eval_every: int | None = None
    stop: dict[str, Any] | None = None

    def cell(self) -> dict[str, Any]:
        """The unit without its seeds, as JSON values."""
        fields = json.loads(json.dumps(dataclasses.asdict(self)))
        del fields["seeds"]
        return fields

    def key(self, seed: int) -> str:
        return row_key({**self.cell(), "seed": seed})

    def tokens_per_step(self) -> int:
        """Tokens one member trains on per step (the main batch and the auxiliary one)."""
        from klalm.tasks.registry import make_task  # lazy: the generators import torch (module doc)

        main = min(self.train.batch_size, self.num_train or self.train.batch_size) * make_task(**self.task).seq_len
        aux = self.train.aux_batch_size * make_task(**self.aux_task).seq_len if self.aux_task else 0
        return main + aux

    def kla_d_state(self) -> int | None:
        """The KLA mixer's d_state where the unit sets it (`model_overrides`), else None (the layer's default)."""
        return kla_d_state(self.model_overrides)

    def label(self) -> str:
        settings = " ".join(f"{k}={v}" for k, v in self.task.items() if k != "name")
        seeds = ",".join(map(str, self.seeds))
        width = f"d={self.d_model}" + (f" S={self.kla_d_state()}" if self.kla_d_state() is not None else "")
        return f"{self.task['name']} {settings} {self.arch} depth={self.n_layers} {width} " \
               f"lr={self.train.lr:g} wd={self.train.weight_decay:g} seeds={seeds}"  # fmt: skip

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Unit:
        return cls(**{**values, "train": TrainSettings(**values["train"])})


CELL_FIELDS = tuple(f.name for f in dataclasses.fields(Unit) if f.name != "seeds")


def row_key(row: dict[str, Any]) -> str:
    """The identity of a result row: its cell's fields and its seed, as canonical JSON."""
    return json.dumps({name: row[name] for name in (*CELL_FIELDS, "seed")}, sort_keys=True)
