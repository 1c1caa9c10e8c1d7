"""What every KLA backend and layer shares: the filter state, its fresh prior, the compute dtype, and the value
precision from log σ². The math is in docs/kla.md.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class KLAState(NamedTuple):
    """Filter state carried between calls.

    lam: posterior precision λ, [B, M, S], > 0 (1 for a fresh sequence).
    eta: information mean η = λ·μ, [B, M, S] (0 for a fresh sequence).
    """

    lam: Tensor
    eta: Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the filter runs in: float64 stays float64, everything else runs in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def precision_from_logvar(logvar: Tensor, floor: float) -> Tensor:
    """The KLA layer's value precision Λ = 1/(softplus(log σ²) + floor) in the compute dtype (float32 at least);
    the floor caps Λ at 1/floor. The Triton kernels form the same Λ inside (`kla_scan_logvar`)."""
    return 1.0 / (torch.nn.functional.softplus(logvar.to(compute_dtype(logvar.dtype))) + floor)


def fresh_state(batch: int, channels: int, state_size: int, device, dtype=torch.float32) -> KLAState:
    """The prior of a fresh sequence: λ_0 = 1, η_0 = 0, each [B, M, S]."""
    shape = (batch, channels, state_size)
    return KLAState(torch.ones(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
