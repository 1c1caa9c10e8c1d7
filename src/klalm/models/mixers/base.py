"""The contract every sequence mixer meets; the backbone knows nothing else about a mixer.

A mixer maps x [B, L, D] to y [B, L, D] and carries whatever it needs to continue a sequence as an
opaque state object (a KV cache for attention; conv window + filter state for the recurrent mixers):

    y, state = mixer(x)              # fresh sequence; state is the state after the last token
    y, state = mixer(x, state)       # continue from a state (prefill or one-token decode, L = 1)
    state = mixer.init_state(batch_size, device, dtype)   # an empty state for step-by-step decode

Decoding a sequence token by token from `init_state` must reproduce the full forward pass. For the
recurrent mixers a one-token call costs O(1) in the sequence length.

States are batch-first: a tuple or NamedTuple of tensors whose dim 0 is the batch (beam search and
batched decoding index and reorder them along dim 0).

Mixers are built as `MixerCls(d_model, layer_idx=i, **options)`, where `options` is the config's dict
for that mixer name. Parameters that must stay out of weight decay carry `param._no_weight_decay = True`
(set where they are defined); the optimiser groups read that mark.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch import Tensor, nn

from klalm.config_checks import RENAMED_MIXER_OPTIONS
from klalm.ops.backends import OpBackends


class Mixer(nn.Module):
    """Base class of sequence mixers: [B, L, D] -> [B, L, D] with a carried state.

    A mixer whose `backend` option picks among an op's backends names that op in `backend_op`, so that
    `klalm.models.prepare_backends` can make the op's "auto" choice before torch.compile traces the mixer.
    """

    d_model: int
    backend_op: OpBackends | None = None

    def forward(self, x: Tensor, state: Any | None = None) -> tuple[Tensor, Any]:
        raise NotImplementedError

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> Any:
        raise NotImplementedError


def no_weight_decay(param: nn.Parameter) -> nn.Parameter:
    """Mark a parameter so the optimiser puts it in the no-weight-decay group; returns it."""
    param._no_weight_decay = True
    return param


def reject_unknown_options(cls: type, unknown: dict) -> None:
    """Raise a ValueError naming the unknown options and listing `cls`'s keyword-only constructor options."""
    for option in unknown:
        if option in RENAMED_MIXER_OPTIONS:
            raise ValueError(f"{cls.__name__} option {option!r} was renamed: use {RENAMED_MIXER_OPTIONS[option]!r}")
    if unknown:
        params = inspect.signature(cls.__init__).parameters.values()
        valid = sorted(p.name for p in params if p.kind is p.KEYWORD_ONLY)
        raise ValueError(f"unknown {cls.__name__} option(s) {sorted(unknown)}; valid: {valid}")


def inverse_softplus_dt(size: int, dt_min: float, dt_max: float, dt_floor: float) -> Tensor:
    """A bias b with softplus(b) log-uniform in [dt_min, dt_max] (floored at dt_floor), as Mamba initialises Δ."""
    if not 0 < dt_min <= dt_max:
        raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
    dt = torch.exp(torch.rand(size) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=dt_floor)
    return dt + torch.log(-torch.expm1(-dt))  # softplus⁻¹(dt)
