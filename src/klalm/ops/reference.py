"""Sequential reference of the KLA filter: the oracle every faster backend is tested against.

Each (channel m, state s) pair is a scalar Kalman filter in information form (docs/kla.md, "The math"):

    φ_t = Λ_t·k_t²      r_t = v_t·Λ_t·k_t      d_t = a² + p·λ_{t-1}
    λ_t = λ_{t-1}/d_t + φ_t                      η_t = (a/d_t)·η_{t-1} + r_t
    y_t = Σ_s q_t·η_t/λ_t                        y_var_t = Σ_s q_t²/λ_t

A plain loop over time, in float32 for low-precision inputs and float64 for float64 inputs, with no
floors or clamps: it is slow and exact, and autograd through it gives the exact gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor

from klalm.ops.common import KLAState, compute_dtype, fresh_state


def kla_step_reference(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    state: KLAState,
    decode_from_prior: bool = False,
) -> tuple[Tensor, Tensor, KLAState]:
    """One predict+update step of the filter, in the dtype of its inputs.

    Shapes: v, lambda_v [B, M]; k, q [B, S]; a, p [M, S]; state tensors [B, M, S].
    Returns (y [B, M], y_var [B, M], new state).
    """
    lam, eta = state
    k_ = k[:, None, :]  # [B, 1, S]
    phi = lambda_v[:, :, None] * k_ * k_  # [B, M, S]
    r = (v * lambda_v)[:, :, None] * k_  # [B, M, S]
    d = a * a + p * lam  # [B, M, S]
    lam = lam / d + phi
    eta = (a / d) * eta + r
    mean, var = eta / lam, 1.0 / lam
    if decode_from_prior:
        mean, var = a * mean, a * a * var + p
    q_ = q[:, None, :]  # [B, 1, S]
    y = (q_ * mean).sum(-1)  # [B, M]
    y_var = (q_ * q_ * var).sum(-1)  # [B, M]
    return y, y_var, KLAState(lam, eta)


def kla_scan_reference(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    initial_state: KLAState | None = None,
    decode_from_prior: bool = False,
) -> tuple[Tensor, Tensor, KLAState]:
    """Run the filter over a whole sequence with a Python loop over time.

    Shapes: v, lambda_v [B, L, M]; k, q [B, L, S]; a, p [M, S]; state tensors [B, M, S].
    Returns (y [B, L, M], y_var [B, L, M]) in v's dtype and the final state in the compute dtype.
    """
    out_dtype, dt = v.dtype, compute_dtype(v.dtype)
    v, lambda_v, k, q, a, p = (x.to(dt) for x in (v, lambda_v, k, q, a, p))
    batch, length, channels = v.shape
    if initial_state is None:
        state = fresh_state(batch, channels, k.shape[-1], v.device, dt)
    else:
        state = KLAState(initial_state.lam.to(dt), initial_state.eta.to(dt))
    ys, y_vars = [], []
    for t in range(length):
        y, y_var, state = kla_step_reference(v[:, t], lambda_v[:, t], k[:, t], q[:, t], a, p, state, decode_from_prior)
        ys.append(y)
        y_vars.append(y_var)
    if length == 0:
        return v.to(out_dtype), v.to(out_dtype), state
    return torch.stack(ys, 1).to(out_dtype), torch.stack(y_vars, 1).to(out_dtype), state
