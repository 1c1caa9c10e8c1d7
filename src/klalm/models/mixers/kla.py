"""The Kalman Linear Attention mixer (Shaj et al., arXiv 2602.10743, 2026); the math is in docs/kla.md.

Per token, every (channel m, state s) pair runs one step of a scalar Kalman filter in information form:

    φ_t = Λ_t·k_t²      r_t = v_t·Λ_t·k_t      d_t = a² + p·λ_{t-1}
    λ_t = λ_{t-1}/d_t + φ_t                      η_t = (a/d_t)·η_{t-1} + r_t
    y_t = Σ_s q_t·η_t/λ_t                        y_var_t = Σ_s q_t²/λ_t

The layer computes the sensors (v, log σ², k, q) from a short causal convolution of the input, the dynamics
(a, p) from learned continuous-time rates, forms Λ = 1/(softplus(log σ²) + floor) in float32, runs
`klalm.ops.kla_scan` (or `kla_step` for one decode token), adds a learned skip λ_skip·z and gates the result with
SiLU(g). (`kla_scan_logvar`, which forms Λ inside the Triton kernels, measured slower on an H200: docs/kla.md.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from klalm.models.mixers.base import Mixer, no_weight_decay
from klalm.models.mixers.conv import CausalConv1d
from klalm.ops import KLAState, kla_scan, kla_step
from klalm.ops.common import compute_dtype, fresh_state, precision_from_logvar
from klalm.ops.scan import KLA_SCAN_OP

SensorBlock = Literal["plain", "mamba"]
Discretization = Literal["ou", "zoh"]
PRECISION_FLOOR = 1e-4  # Λ = 1/(softplus(log σ²) + floor): caps the value precision at 1e4


class KLAMixerState(NamedTuple):
    """Decode state of one KLA layer.

    conv: the last d_conv - 1 pre-convolution inputs z, [B, M, d_conv - 1], in the activation dtype.
    filter: the filter state `KLAState(lam, eta)`, each [B, M, S], float32 (float64 for float64 models).
    """

    conv: Tensor
    filter: KLAState


def _discretize_ou(rate: Tensor, step: Tensor, noise_rate: Tensor) -> Tensor:
    """Exact Ornstein-Uhlenbeck process noise: p = p_c/(2|α|)·(1 − exp(−2|α|Δ)); all [M, S]."""
    return noise_rate / (2 * rate) * -torch.expm1(-2 * rate * step)


def _discretize_zoh(rate: Tensor, step: Tensor, noise_rate: Tensor) -> Tensor:
    """Zero-order-hold (Euler) process noise: p = p_c·Δ; all [M, S]."""
    return noise_rate * step


DISCRETIZATIONS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "ou": _discretize_ou,
    "zoh": _discretize_zoh,
}


def _plain_sensors(m: int, rank: int) -> tuple[nn.Module, nn.Module]:
    """The "plain" block: v = Linear(M→M)(z), log σ² = Linear(M→M)(z)."""
    return nn.Linear(m, m), nn.Linear(m, m)


def _mamba_sensors(m: int, rank: int) -> tuple[nn.Module, nn.Module]:
    """The "mamba" block: v = z, log σ² = Linear(r→M)(Linear(M→r, no bias)(z)) with r = ceil(D/8)."""
    return nn.Identity(), nn.Sequential(nn.Linear(m, rank, bias=False), nn.Linear(rank, m))


# block name -> builder of the (v, log σ²) sensor maps, called with (M, r)
SENSOR_BLOCKS: dict[str, Callable[[int, int], tuple[nn.Module, nn.Module]]] = {
    "plain": _plain_sensors,
    "mamba": _mamba_sensors,
}


class KLAMixer(Mixer):
    """KLA token mixer: in_proj → causal conv + SiLU → sensors → Kalman scan → skip, SiLU gate → out_proj.

    Args:
        d_model: model width D.
        layer_idx: index of the layer in the stack (kept for logging and per-layer init rules).
        d_state: state size S per channel.
        expand: channel expansion; M = d_inner = expand·D.
        block: "plain" (v and log σ² from full Linear(M→M) maps) or "mamba" (v = z, log σ² from a
            low-rank M→r→M map with r = ceil(D/8)).
        d_conv: width K of the depthwise causal conv1d.
        discretization: "ou" (exact Ornstein-Uhlenbeck) or "zoh" (p = p_c·Δ) process noise.
        zero_process_noise: ablation with p = 0 (the layer then has no p_c parameter).
        decode_from_prior: read out the one-step-ahead prediction (a·μ, a²σ² + p) instead of the posterior.
        dt_min, dt_max: range of the log-uniform initial step Δ.
        noise_init: initial continuous process-noise rate p_c.
        skip_init: initial value of the learned scalar skip λ_skip.
        backend: backend passed to `klalm.ops.kla_scan` ("auto", "reference", "torch", "triton").

    Parameter count, with D = d_model, M = expand·D, S = d_state, K = d_conv, r = ceil(D/8):

        in_proj D·2M (no bias) + conv M·K + M + k, q projections 2·M·S (no bias)
        + dynamics α_log, δ, p_c 3·M·S (2·M·S with zero_process_noise) + λ_skip 1 + out_proj M·D (no bias)
        plain block: + v_proj M·M + M + log σ² projection M·M + M
            total = 3·D·M + 2·M² + (K + 3)·M + 5·M·S + 1
        mamba block: + log σ² low rank M·r (no bias) + r·M + M
            total = 3·D·M + 2·M·r + (K + 2)·M + 5·M·S + 1
    (subtract M·S from either total with zero_process_noise). For D = 512, S = 16 the mamba block has
    3·512·1024 + 2·1024·64 + 6·1024 + 5·1024·16 + 1 = 1,792,001 parameters, about 6.8·D².

    Shapes: forward maps x [B, L, D] to y [B, L, D]; the state is a `KLAMixerState`.
    """

    backend_op = KLA_SCAN_OP

    def __init__(
        self,
        d_model: int,
        layer_idx: int = 0,
        *,
        d_state: int = 16,
        expand: int = 2,
        block: SensorBlock = "mamba",
        d_conv: int = 4,
        discretization: Discretization = "ou",
        zero_process_noise: bool = False,
        decode_from_prior: bool = False,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        noise_init: float = 0.01,
        skip_init: float = -1.0,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        _validate_options(d_model, d_state, expand, block, d_conv, discretization, dt_min, dt_max, noise_init)
        self.d_model, self.layer_idx, self.d_state = d_model, layer_idx, d_state
        self.d_inner = m = expand * d_model
        self.block, self.d_conv, self.discretization = block, d_conv, discretization
        self.zero_process_noise, self.decode_from_prior = zero_process_noise, decode_from_prior
        self.backend = backend
        self.rank = math.ceil(d_model / 8)

        self.in_proj = nn.Linear(d_model, 2 * m, bias=False)
        self.conv = CausalConv1d(m, d_conv)
        self.v_proj, self.logvar_proj = SENSOR_BLOCKS[block](m, self.rank)
        self.k_proj = nn.Linear(m, d_state, bias=False)
        self.q_proj = nn.Linear(m, d_state, bias=False)
        self._init_dynamics(m, d_state, dt_min, dt_max, noise_init)
        self.skip = no_weight_decay(nn.Parameter(torch.full((1,), float(skip_init))))  # [1], not 0-d: FSDP2 shards it
        self.out_proj = nn.Linear(m, d_model, bias=False)

    def _init_dynamics(self, m: int, s: int, dt_min: float, dt_max: float, noise_init: float) -> None:
        """α_log = 0 (|α| = 1); δ = softplus⁻¹(Δ) with Δ log-uniform in [dt_min, dt_max]; p_c = noise_init."""
        self.alpha_log = no_weight_decay(nn.Parameter(torch.zeros(m, s)))
        step = torch.exp(torch.empty(m, s).uniform_(math.log(dt_min), math.log(dt_max)))
        self.delta = no_weight_decay(nn.Parameter(step + torch.log(-torch.expm1(-step))))  # softplus⁻¹(Δ)
        self.p_c = None
        if not self.zero_process_noise:
            self.p_c = no_weight_decay(nn.Parameter(torch.full((m, s), float(noise_init))))

    def dynamics(self) -> tuple[Tensor, Tensor]:
        """The discrete decay a in (0, 1] and process noise p ≥ 0, each [M, S], float32 (float64 models stay).

        |α| = exp(α_log), Δ = softplus(δ), and the continuous noise rate is |p_c| (so it stays ≥ 0).
        """
        dtype = compute_dtype(self.alpha_log.dtype)
        rate = torch.exp(self.alpha_log.to(dtype))  # [M, S]
        step = F.softplus(self.delta.to(dtype))  # [M, S]
        a = torch.exp(-rate * step)
        if self.p_c is None:
            return a, torch.zeros_like(a)
        return a, DISCRETIZATIONS[self.discretization](rate, step, self.p_c.to(dtype).abs())

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> KLAMixerState:
        """An empty decode state: zero conv window and the fresh filter prior (λ = 1, η = 0)."""
        conv = self.conv.init_window(batch_size, device, dtype)
        filt = fresh_state(batch_size, self.d_inner, self.d_state, device, compute_dtype(dtype))
        return KLAMixerState(conv, filt)

    def _conv(self, z: Tensor, window: Tensor | None) -> tuple[Tensor, Tensor]:
        """Causal depthwise conv + SiLU. z [B, L, M], window [B, M, K-1] or None -> (z [B, L, M], window)."""
        z, window = self.conv(z, window)
        return F.silu(z), window

    def _sensors(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """v, log σ² [B, L, M] and L2-normalised k, q [B, L, S] from the convolved inputs z [B, L, M]."""
        v = self.v_proj(z)
        logvar = self.logvar_proj(z)
        k = F.normalize(self.k_proj(z), dim=-1)
        q = F.normalize(self.q_proj(z), dim=-1)
        return v, logvar, k, q

    def forward(
        self, x: Tensor, state: KLAMixerState | None = None, *, return_variance: bool = False
    ) -> tuple[Tensor, KLAMixerState] | tuple[Tensor, KLAMixerState, Tensor]:
        """Mix a sequence, optionally continuing from `state`.

        Args:
            x: inputs [B, L, D].
            state: a `KLAMixerState` to continue from, or None for a fresh sequence. With L == 1 and a
                state the call is one O(1) decode step through `kla_step`.
            return_variance: also return the output variance.

        Returns:
            (y [B, L, D], new state), or (y, new state, y_var [B, L, D]) with y_var ≥ 0, the filter's
            predictive variance gated by SiLU(g)² and pushed through out_proj's squared weights.
        """
        z, g = self.in_proj(x).chunk(2, dim=-1)  # [B, L, M] each
        z, window = self._conv(z, None if state is None else state.conv)
        v, logvar, k, q = self._sensors(z)
        a, p = self.dynamics()
        fstate = None if state is None else state.filter
        lambda_v = precision_from_logvar(logvar, PRECISION_FLOOR)  # [B, L, M], float32 at least
        if state is not None and x.shape[1] == 1:
            y, y_var, fstate = kla_step(
                v[:, 0], lambda_v[:, 0], k[:, 0], q[:, 0], a, p, fstate, decode_from_prior=self.decode_from_prior
            )
            y, y_var = y[:, None], y_var[:, None]  # [B, 1, M]
        else:
            y, y_var, fstate = kla_scan(
                v, lambda_v, k, q, a, p, fstate, backend=self.backend, decode_from_prior=self.decode_from_prior,
                variance=return_variance,
            )  # fmt: skip
        gate = F.silu(g)
        out = self.out_proj(((y + self.skip * z) * gate).to(x.dtype))
        new_state = KLAMixerState(window, fstate)
        if not return_variance:
            return out, new_state
        w2 = self.out_proj.weight.to(y_var.dtype) ** 2  # [D, M]
        return out, new_state, F.linear(y_var * gate.to(y_var.dtype) ** 2, w2)


def _validate_options(
    d_model: int,
    d_state: int,
    expand: int,
    block: str,
    d_conv: int,
    discretization: str,
    dt_min: float,
    dt_max: float,
    noise_init: float,
) -> None:
    """Raise ValueError naming the first bad constructor option."""
    if block not in SENSOR_BLOCKS:
        raise ValueError(f"unknown KLA block {block!r}; valid: {sorted(SENSOR_BLOCKS)}")
    if discretization not in DISCRETIZATIONS:
        raise ValueError(f"unknown discretization {discretization!r}; valid: {sorted(DISCRETIZATIONS)}")
    for name, value in (("d_model", d_model), ("d_state", d_state), ("expand", expand), ("d_conv", d_conv)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if not 0 < dt_min <= dt_max:
        raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
    if noise_init < 0:
        raise ValueError(f"noise_init must be >= 0, got {noise_init}")
