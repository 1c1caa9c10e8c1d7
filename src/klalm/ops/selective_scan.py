"""Mamba-1 selective scan (Gu & Dao 2023): a diagonal affine recurrence with input-dependent Δ, B, C.

    h_t = exp(Δ_t·A) ⊙ h_{t-1} + (Δ_t·u_t) ⊗ B_t        y_t = h_t · C_t + D ⊙ u_t

Shapes: u, delta [B, L, M]; A [M, N] (negative); Bm, Cm [B, L, N]; D [M]; state h [B, M, N].
The sequential loop here is the oracle; faster backends register in `SELECTIVE_SCAN_BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def selective_scan_reference(
    u: Tensor, delta: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, D: Tensor | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Loop over time in float32 (float64 stays float64). Returns (y [B, L, M] in u's dtype, h [B, M, N])."""
    out_dtype = u.dtype
    dt = torch.float64 if u.dtype == torch.float64 else torch.float32
    u, delta, A, Bm, Cm = (x.to(dt) for x in (u, delta, A, Bm, Cm))
    batch, length, channels = u.shape
    h = u.new_zeros(batch, channels, A.shape[-1]) if initial_state is None else initial_state.to(dt)
    ys = []
    for t in range(length):
        decay = torch.exp(delta[:, t, :, None] * A)                          # [B, M, N]
        h = decay * h + (delta[:, t] * u[:, t])[:, :, None] * Bm[:, t, None, :]
        ys.append((h * Cm[:, t, None, :]).sum(-1))                           # [B, M]
    y = torch.stack(ys, 1) if ys else u.clone()
    if D is not None:
        y = y + u * D.to(dt)
    return y.to(out_dtype), h


SELECTIVE_SCAN_BACKENDS: dict[str, Callable] = {"reference": selective_scan_reference}


def selective_scan(
    u: Tensor, delta: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, D: Tensor | None = None,
    initial_state: Tensor | None = None, *, backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Selective scan with a choice of backend; shapes as in the module docstring."""
    name = "reference" if backend == "auto" else backend
    if name not in SELECTIVE_SCAN_BACKENDS:
        valid = sorted(SELECTIVE_SCAN_BACKENDS) + ["auto"]
        raise ValueError(f"unknown selective_scan backend {backend!r}; valid: {valid}")
    return SELECTIVE_SCAN_BACKENDS[name](u, delta, A, Bm, Cm, D, initial_state)
