"""Gated DeltaNet mixer (Yang, Kautz & Hatamizadeh 2024/25, "Gated Delta Networks: Improving Mamba2 with
Delta Rule"), laid out as flash-linear-attention's `GatedDeltaNet` layer.

    q, k, v = SiLU(causal depthwise conv(W_q x, W_k x, W_v x))     q, k [B, L, H, K], v [B, L, H, V]
    q, k    ← q/‖q‖, k/‖k‖ (per head)
    β       = sigmoid(W_β x)                                        [B, L, H]
    g       = −exp(A_log) · softplus(W_a x + dt_bias)               [B, L, H], log decay (Mamba-2 style)
    h_t     = e^{g_t} (I − β_t k_t k_tᵀ) h_{t−1} + β_t k_t v_tᵀ,  o_t = h_tᵀ q_t / sqrt(K)   (`klalm.ops.gdn`)
    y       = out_proj(RMSNorm_head(o) ⊙ SiLU(W_g x))

Sizing: H·K = 0.75·D and V = expand_v·K = 2K (fla's defaults, e.g. D 2048, 6 heads of K 256), so
H·V = 1.5·D and the parameter count per layer is

    qkv D(2HK + HV) + conv (2HK + HV)·d_conv + W_a, W_β 2DH + A_log, dt_bias 2H + W_g D·HV + norm V + out HV·D
      = 6D² + 3D·d_conv + 2DH + 2H + V                       (at the default sizing)

which matches Mamba's 6D² + O(D) and so compares fairly with it. E.g. D = 512, H = 6, K = 64, V = 128:
1,572,864 + 6,144 + 6,144 + 12 + 128 = 1,585,292 per layer. A_log and dt_bias carry the no-weight-decay mark.
Decode state: `GDNState(conv, recurrent)`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from klalm.models.mixers.base import Mixer, inverse_softplus_dt, no_weight_decay, reject_unknown_options
from klalm.models.mixers.conv import CausalConv1d
from klalm.ops.common import compute_dtype
from klalm.ops.gdn import GDN_BACKENDS, GDN_OP, gated_delta_rule

QK_NORM_EPS = 1e-6  # floor on ‖q‖, ‖k‖ in the L2 normalisation


class GDNState(NamedTuple):
    """Decode state of a Gated DeltaNet layer.

    conv: the last d_conv − 1 inputs of the q/k/v conv, [B, 2HK + HV, d_conv − 1], activation dtype.
    recurrent: the delta-rule state h, [B, H, K, V], float32 (float64 for float64 activations).
    """

    conv: Tensor
    recurrent: Tensor


class GatedDeltaNetMixer(Mixer):
    """Gated DeltaNet layer; see the module docstring for the math and the parameter count.

    Args:
        d_model: model width D.
        layer_idx: index of this layer in the stack.
        n_heads: H.
        head_dim: key/query head dim K; 0.75·D/H when None (must then divide evenly).
        expand_v: value head dim V = expand_v·K.
        d_conv: kernel of the short causal conv on q, k, v.
        norm_eps: epsilon of the per-head output RMSNorm.
        A_init_range: A = exp(A_log) starts uniform in this range (per head).
        dt_min, dt_max, dt_init_floor: range of the initial softplus(dt_bias) (log-uniform) and its floor.
        backend: gated-delta-rule backend ("auto", "torch", "fla", "reference").
        chunk_size: chunk length of the chunked backends.
    """

    backend_op = GDN_OP

    def __init__(
        self,
        d_model: int,
        layer_idx: int = 0,
        *,
        n_heads: int = 6,
        head_dim: int | None = None,
        expand_v: int = 2,
        d_conv: int = 4,
        norm_eps: float = 1e-5,
        A_init_range: tuple[float, float] = (1.0, 16.0),
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        dt_init_floor: float = 1e-4,
        backend: str = "auto",
        chunk_size: int = 64,
        **unknown,
    ):
        super().__init__()
        reject_unknown_options(type(self), unknown)
        head_dim = _default_head_dim(d_model, n_heads) if head_dim is None else head_dim
        for key, value in (
            ("d_model", d_model),
            ("n_heads", n_heads),
            ("head_dim", head_dim),
            ("expand_v", expand_v),
            ("d_conv", d_conv),
            ("chunk_size", chunk_size),
        ):
            if int(value) != value or value < 1:
                raise ValueError(f"GatedDeltaNetMixer option {key} must be a positive integer, got {value!r}")
        if backend not in {*GDN_BACKENDS, "auto"}:
            valid = sorted(GDN_BACKENDS) + ["auto"]
            raise ValueError(f"GatedDeltaNetMixer option backend={backend!r} is unknown; valid: {valid}")
        if not 0 < A_init_range[0] <= A_init_range[1]:
            raise ValueError(f"GatedDeltaNetMixer option A_init_range must satisfy 0 < lo <= hi, got {A_init_range}")
        self.d_model, self.layer_idx, self.backend, self.chunk_size = d_model, layer_idx, backend, chunk_size
        self.n_heads, self.head_k_dim, self.head_v_dim = n_heads, head_dim, expand_v * head_dim
        self.key_dim, self.value_dim = n_heads * head_dim, n_heads * self.head_v_dim
        self.norm_eps = norm_eps
        self.qkv_proj = nn.Linear(d_model, 2 * self.key_dim + self.value_dim, bias=False)
        self.conv = CausalConv1d(2 * self.key_dim + self.value_dim, d_conv, bias=False)
        self.a_proj = nn.Linear(d_model, n_heads, bias=False)
        self.b_proj = nn.Linear(d_model, n_heads, bias=False)
        a_init = torch.empty(n_heads).uniform_(*A_init_range)
        self.A_log = no_weight_decay(nn.Parameter(torch.log(a_init)))
        self.dt_bias = no_weight_decay(nn.Parameter(inverse_softplus_dt(n_heads, dt_min, dt_max, dt_init_floor)))
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.o_norm_weight = nn.Parameter(torch.ones(self.head_v_dim))
        self.out_proj = nn.Linear(self.value_dim, d_model, bias=False)

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> GDNState:
        """Empty decode state: zero conv window and zero recurrent state [B, H, K, V]."""
        rec_dtype = compute_dtype(dtype)
        shape = (batch_size, self.n_heads, self.head_k_dim, self.head_v_dim)
        return GDNState(
            self.conv.init_window(batch_size, device, dtype), torch.zeros(shape, device=device, dtype=rec_dtype)
        )

    def forward(self, x: Tensor, state: GDNState | None = None) -> tuple[Tensor, GDNState]:
        """x [B, L, D] (and optionally the state after the previous tokens) -> (y [B, L, D], new state)."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"GatedDeltaNetMixer expects x [B, L, {self.d_model}], got {tuple(x.shape)}")
        window, h0 = (None, None) if state is None else state
        qkv, window = self.conv(self.qkv_proj(x), window)
        q, k, v = F.silu(qkv).split([self.key_dim, self.key_dim, self.value_dim], -1)
        q = F.normalize(q.unflatten(-1, (self.n_heads, -1)), dim=-1, eps=QK_NORM_EPS)  # [B, L, H, K]
        k = F.normalize(k.unflatten(-1, (self.n_heads, -1)), dim=-1, eps=QK_NORM_EPS)  # [B, L, H, K]
        v = v.unflatten(-1, (self.n_heads, -1))  # [B, L, H, V]
        beta = torch.sigmoid(self.b_proj(x))  # [B, L, H]
        g = -torch.exp(self.A_log) * F.softplus(self.a_proj(x) + self.dt_bias)  # [B, L, H]
        o, h = gated_delta_rule(q, k, v, g, beta, h0, backend=self.backend, chunk_size=self.chunk_size)
        o = F.rms_norm(o, (self.head_v_dim,), self.o_norm_weight.to(o.dtype), self.norm_eps)
        o = o * F.silu(self.g_proj(x).unflatten(-1, (self.n_heads, -1)))  # [B, L, H, V]
        return self.out_proj(o.flatten(-2)), GDNState(window, h)  # [B, L, D]


def _default_head_dim(d_model: int, n_heads: int) -> int:
    """K = 0.75·D/H, which must be a whole number."""
    key_dim = 0.75 * d_model
    if key_dim % n_heads or key_dim != int(key_dim):
        raise ValueError(
            f"GatedDeltaNetMixer: 0.75·d_model = {key_dim} is not divisible by n_heads={n_heads}; "
            f"set head_dim explicitly"
        )
    return int(key_dim) // n_heads
