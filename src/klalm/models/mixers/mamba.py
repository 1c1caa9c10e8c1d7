"""Mamba-1 mixer (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces").

    x, z  = in_proj(x_in)                          each [B, L, M], M = expand·D
    x     = SiLU(causal depthwise conv1d(x))       kernel d_conv
    δ, B, C = x_proj(x)                            δ low rank R = ceil(D/16); B, C [B, L, N]
    Δ     = softplus(dt_proj(δ) + dt_bias)         [B, L, M]
    h_t   = exp(Δ_t A) ⊙ h_{t−1} + (Δ_t x_t) ⊗ B_t,   A = −exp(A_log) [M, N] (S4D-real init A = −(1..N))
    y_t   = h_t C_t + D ⊙ x_t                      (the selective scan, `klalm.ops.selective_scan`)
    out   = out_proj(y ⊙ SiLU(z))

Parameters per layer (no biases on the projections, as in the paper's code):

    in_proj 2DM + conv M(d_conv + 1) + x_proj M(R + 2N) + dt_proj RM + dt_bias M + A_log MN + D M + out_proj MD
      = 3DM + M(2R + 3N + d_conv + 3)            = 6D² + 2D(2R + 3N + d_conv + 3) at expand 2.

E.g. D = 512 (R = 32, N = 16, d_conv 4): 1,572,864 + 1024·119 = 1,694,720 per layer.
A_log, D and dt_bias carry the no-weight-decay mark. Decode state: `MambaState(conv, ssm)`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from klalm.models.mixers.base import Mixer, inverse_softplus_dt, no_weight_decay, reject_unknown_options
from klalm.models.mixers.conv import CausalConv1d
from klalm.ops.common import compute_dtype
from klalm.ops.selective_scan import SELECTIVE_SCAN_BACKENDS, SELECTIVE_SCAN_OP, selective_scan


class MambaState(NamedTuple):
    """Decode state of a Mamba layer.

    conv: the last d_conv − 1 conv inputs, [B, M, d_conv − 1], in the activation dtype.
    ssm: the selective-scan state h, [B, M, N], float32 (float64 for float64 activations).
    """

    conv: Tensor
    ssm: Tensor


class MambaMixer(Mixer):
    """Mamba-1 selective-SSM block; see the module docstring for the math and the parameter count.

    Args:
        d_model: model width D.
        layer_idx: index of this layer in the stack (kept for logging and caches).
        d_state: SSM state size N per channel.
        expand: M = expand·D channels.
        d_conv: kernel of the causal depthwise conv.
        dt_rank: rank R of the Δ projection; ceil(D/16) when None.
        dt_min, dt_max, dt_init_floor: range of the initial step Δ (log-uniform) and its floor.
        backend: selective-scan backend ("auto", "torch", "triton", "reference").
    """

    backend_op = SELECTIVE_SCAN_OP

    def __init__(
        self,
        d_model: int,
        layer_idx: int = 0,
        *,
        d_state: int = 16,
        expand: int = 2,
        d_conv: int = 4,
        dt_rank: int | None = None,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        dt_init_floor: float = 1e-4,
        backend: str = "auto",
        **unknown,
    ):
        super().__init__()
        reject_unknown_options(type(self), unknown)
        for key, value in (("d_model", d_model), ("d_state", d_state), ("expand", expand), ("d_conv", d_conv)):
            if int(value) != value or value < 1:
                raise ValueError(f"MambaMixer option {key} must be a positive integer, got {value!r}")
        if backend not in {*SELECTIVE_SCAN_BACKENDS, "auto"}:
            valid = sorted(SELECTIVE_SCAN_BACKENDS) + ["auto"]
            raise ValueError(f"MambaMixer option backend={backend!r} is unknown; valid: {valid}")
        self.d_model, self.layer_idx, self.backend = d_model, layer_idx, backend
        self.d_inner, self.d_state = expand * d_model, d_state
        self.dt_rank = math.ceil(d_model / 16) if dt_rank is None else dt_rank
        if self.dt_rank < 1:
            raise ValueError(f"MambaMixer option dt_rank must be >= 1, got {dt_rank!r}")
        m, n, r = self.d_inner, d_state, self.dt_rank
        self.in_proj = nn.Linear(d_model, 2 * m, bias=False)
        self.conv = CausalConv1d(m, d_conv, bias=True)
        self.x_proj = nn.Linear(m, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, m, bias=False)
        nn.init.uniform_(self.dt_proj.weight, -(r**-0.5), r**-0.5)
        self.dt_bias = no_weight_decay(nn.Parameter(inverse_softplus_dt(m, dt_min, dt_max, dt_init_floor)))
        a_init = torch.arange(1, n + 1, dtype=torch.float32).repeat(m, 1)  # [M, N]: S4D-real A = −(1..N)
        self.A_log = no_weight_decay(nn.Parameter(torch.log(a_init)))
        self.D = no_weight_decay(nn.Parameter(torch.ones(m)))
        self.out_proj = nn.Linear(m, d_model, bias=False)

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> MambaState:
        """Empty decode state: zero conv window [B, M, d_conv − 1] and zero SSM state [B, M, N]."""
        ssm_dtype = compute_dtype(dtype)
        ssm = torch.zeros(batch_size, self.d_inner, self.d_state, device=device, dtype=ssm_dtype)
        return MambaState(self.conv.init_window(batch_size, device, dtype), ssm)

    def forward(self, x: Tensor, state: MambaState | None = None) -> tuple[Tensor, MambaState]:
        """x [B, L, D] (and optionally the state after the previous tokens) -> (y [B, L, D], new state)."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"MambaMixer expects x [B, L, {self.d_model}], got {tuple(x.shape)}")
        window, h0 = (None, None) if state is None else state
        xs, z = self.in_proj(x).chunk(2, -1)  # each [B, L, M]
        xs, window = self.conv(xs, window)
        xs = F.silu(xs)
        dt, b_in, c_out = self.x_proj(xs).split([self.dt_rank, self.d_state, self.d_state], -1)
        delta = F.softplus(self.dt_proj(dt) + self.dt_bias)  # [B, L, M], ≥ float32
        a = -torch.exp(self.A_log)  # [M, N]
        y, h = selective_scan(xs, delta, a, b_in, c_out, self.D, h0, backend=self.backend)
        y = y * F.silu(z)
        return self.out_proj(y), MambaState(window, h)
