"""Optimiser parameter groups and learning-rate schedules.

Weight decay applies to matrices only. A parameter goes to the no-decay group when it carries the mark
`param._no_weight_decay = True` (the KLA/SSM dynamics set it where they are defined), or by rule: every tensor with
fewer than two dimensions (norm gains, biases, scalars) and every embedding table. Marked parameters are the
"dynamics" and may get their own learning rate (`dynamics_lr_scale` × lr).

Schedules are multipliers of the base lr, built as `LambdaLR`s so their state is a step count and resumes exactly:

- `warmup_cosine`: linear warmup from 0, cosine decay to `min_lr_ratio` at the last step. `cosine_multiplier_tensor`
  computes the same multiplier from a step held in a device tensor, so a training step captured as a CUDA graph
  (klalm.tasks.train) runs its schedule without the host.
- `warmup_stable_decay` (WSD): linear warmup, constant, then a decay over the final `decay_frac` of the run
  ("linear", "1-sqrt" or "cosine") to `min_lr_ratio`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from klalm.config_checks import check_schedule, warmup_steps_of
from klalm.param_names import clean_name


def classify_parameters(model: nn.Module) -> dict[str, str]:
    """Maps each trainable parameter's clean name to its group: "decay", "no_decay" or "dynamics".

    Call this on the unwrapped model (before FSDP flattens parameters), since it reads the `_no_weight_decay` mark.
    """
    embedding_params = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    groups = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if getattr(param, "_no_weight_decay", False):
            groups[clean_name(name)] = "dynamics"
        elif param.ndim < 2 or id(param) in embedding_params:
            groups[clean_name(name)] = "no_decay"
        else:
            groups[clean_name(name)] = "decay"
    return groups


def param_groups(
    named_params: list[tuple[str, nn.Parameter]],
    classes: dict[str, str],
    *,
    lr: float,
    weight_decay: float,
    dynamics_lr_scale: float = 1.0,
) -> list[dict]:
    """Builds AdamW parameter groups from a classification made by `classify_parameters`.

    Args:
        named_params: (name, parameter) pairs of the possibly wrapped model; names are cleaned before lookup.
        classes: clean name → "decay" / "no_decay" / "dynamics".
        lr: base learning rate.
        weight_decay: decoupled weight decay of the "decay" group.
        dynamics_lr_scale: learning-rate multiplier of the "dynamics" group.

    Returns:
        Non-empty groups, each with "params", "lr", "weight_decay" and "name".

    Raises:
        KeyError: a trainable parameter that `classes` does not know.
    """
    settings = {
        "decay": (lr, weight_decay),
        "no_decay": (lr, 0.0),
        "dynamics": (lr * dynamics_lr_scale, 0.0),
    }
    buckets: dict[str, list[nn.Parameter]] = {key: [] for key in settings}
    for name, param in named_params:
        if not param.requires_grad:
            continue
        key = clean_name(name)
        if key not in classes:
            raise KeyError(f"parameter {key!r} was not classified for weight decay (known: {len(classes)} names)")
        buckets[classes[key]].append(param)
    return [
        {"params": params, "lr": settings[group][0], "weight_decay": settings[group][1], "name": group}
        for group, params in buckets.items()
        if params
    ]


def cosine_multiplier(step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """lr multiplier at `step` (0-based) of linear warmup then cosine decay to `min_lr_ratio`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - 1 - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def cosine_multiplier_tensor(step: Tensor, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> Tensor:
    """`cosine_multiplier` of a step held in an integer tensor, in float64 on the step's device, without a host sync.

    Args:
        step: 0-based optimiser step, an integer tensor of any shape (a 0-d counter in the synthetic trainer).
        warmup_steps, total_steps, min_lr_ratio: as in `cosine_multiplier`.

    Returns:
        float64 tensor shaped like `step`.
    """
    step = step.to(torch.float64)
    warm = (step + 1) / max(warmup_steps, 1)
    progress = ((step - warmup_steps) / max(1, total_steps - 1 - warmup_steps)).clamp(max=1.0)
    decay = min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + torch.cos(math.pi * progress))
    return torch.where(step < warmup_steps, warm, decay)


def wsd_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, decay_steps: int, min_lr_ratio: float, shape: str
) -> float:
    """lr multiplier at `step` of warmup → stable → decay over the last `decay_steps` steps."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_start = total_steps - decay_steps
    if step < decay_start:
        return 1.0
    progress = min(1.0, (step - decay_start + 1) / decay_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * DECAY_SHAPES[shape](progress)


DECAY_SHAPES: dict[str, Callable[[float], float]] = {
    "linear": lambda x: 1.0 - x,
    "1-sqrt": lambda x: 1.0 - math.sqrt(x),
    "cosine": lambda x: 0.5 * (1 + math.cos(math.pi * x)),
}


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, *, warmup: float = 0.01, min_lr_ratio: float = 0.1
) -> LambdaLR:
    """Linear warmup then cosine decay (the scheduler config's `_partial_` target).

    Args:
        optimizer: the optimiser whose groups' lr is scaled.
        total_steps: optimiser steps in the run (from the token budget).
        warmup: warmup length: a fraction of `total_steps` if < 1, else a step count.
        min_lr_ratio: final lr as a fraction of the peak.
    """
    warmup_steps = warmup_steps_of(warmup, total_steps)
    check_schedule(total_steps, warmup_steps, min_lr_ratio)
    fn = partial(cosine_multiplier, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio)
    return LambdaLR(optimizer, fn)


def warmup_stable_decay(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    *,
    warmup: float = 0.01,
    decay_frac: float = 0.2,
    min_lr_ratio: float = 0.0,
    shape: str = "1-sqrt",
) -> LambdaLR:
    """Warmup-stable-decay (WSD) schedule (the scheduler config's `_partial_` target).

    Args:
        optimizer: the optimiser whose groups' lr is scaled.
        total_steps: optimiser steps in the run.
        warmup: warmup length: a fraction of `total_steps` if < 1, else a step count.
        decay_frac: fraction of the run, at its end, spent decaying; in (0, 1].
        min_lr_ratio: final lr as a fraction of the peak.
        shape: decay curve, a key of `DECAY_SHAPES`.
    """
    if shape not in DECAY_SHAPES:
        raise KeyError(f"scheduler.shape={shape!r} is unknown; valid: {sorted(DECAY_SHAPES)}")
    if not 0 < decay_frac <= 1:
        raise ValueError(f"scheduler.decay_frac={decay_frac} must be in (0, 1]")
    warmup_steps = warmup_steps_of(warmup, total_steps)
    check_schedule(total_steps, warmup_steps, min_lr_ratio)
    decay_steps = max(1, min(total_steps - warmup_steps, int(round(decay_frac * total_steps))))
    fn = partial(
        wsd_multiplier,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        decay_steps=decay_steps,
        min_lr_ratio=min_lr_ratio,
        shape=shape,
    )
    return LambdaLR(optimizer, fn)
