"""Multi-head causal self-attention with rotary position embeddings (the "gpt" mixer).

Vaswani et al. 2017, with RoPE (Su et al. 2021, "RoFormer") applied to queries and keys:

    q, k, v = x·W_qkv                         each [B, H, L, E], E = D / H (head width)
    q, k    ← rotate(q, k) by angle pos·θ_i,  θ_i = rope_theta^(−2i/E), i < E/2 (rotate-half layout)
    o_t     = Σ_{u ≤ t} softmax_u(q_t·k_u / √E)·v_u
    y       = o·W_out

Two interchangeable implementations of the softmax step: "sdpa" (torch's scaled_dot_product_attention,
FlashAttention on a GPU) and "math" (an explicit masked softmax in plain torch, the oracle for "sdpa").
The state is a KV cache: the rotated keys and the values of every token seen so far; its length is the
position of the next token, so decoding continues the rotary positions where the prefix ended.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from klalm.models.mixers.base import Mixer


class KVCache(NamedTuple):
    """Attention state: rotated keys and values of the tokens seen so far, each [B, H, T, E] (T tokens)."""

    k: Tensor
    v: Tensor


# (theta, E/2, P, device) -> [2, P, E/2] float32: cos and sin of the RoPE angles of positions 0 .. P-1 (P a power of 2)
_ROPE_TABLES: dict[tuple[float, int, int, str], Tensor] = {}


@torch.library.custom_op("klalm::rope_table", mutates_args=())
def rope_table(theta: float, half: int, start: int, end: int, device: torch.device) -> Tensor:
    """cos and sin of pos·θ_i for start ≤ pos < end, i < half: [2, end − start, half] float32 (a fresh copy of those
    rows of a table built once per (θ, half, device) and power of two ≥ end, so that one table serves many lengths).

    A custom op, so torch.compile keeps it one opaque call inside the model's graph. Traced as plain ops, the
    table's cos and sin were fused into the kernels that read them and computed again for every element of q and
    k (inductor's choice; 7 ms of a compiled gpt_45m step on an H200); built in a `torch.compiler.disable`d
    function, as before 2026-12-04, it broke the compiled model into dozens of graphs a forward. Only the rows
    asked for are copied: decoding one token copies one row."""
    positions = 1 << max(end - 1, 1).bit_length()
    key = (theta, half, positions, str(device))
    if key not in _ROPE_TABLES:
        inv_freq = theta ** (-torch.arange(half, device=device, dtype=torch.float32) / half)  # [E/2]
        angles = torch.arange(positions, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [P, E/2]
        _ROPE_TABLES[key] = torch.stack((angles.cos(), angles.sin()))
    return _ROPE_TABLES[key][:, start:end].clone()  # a custom op's output is its own: compiled code may reuse it


@rope_table.register_fake
def _(theta: float, half: int, start: int, end: int, device: torch.device) -> Tensor:
    return torch.empty(2, end - start, half, device=device, dtype=torch.float32)


def rotary(x: Tensor, offset: int, theta: float) -> Tensor:
    """Rotate x [B, H, L, E] by the RoPE angles of positions offset .. offset+L-1 (rotate-half layout)."""
    half, end = x.shape[-1] // 2, offset + x.shape[-2]
    cos, sin = rope_table(theta, half, offset, end, x.device).to(x.dtype).unbind(0)  # each [L, E/2]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _causal_mask(n_query: int, n_key: int, device: torch.device) -> Tensor:
    """Bool mask [Lq, Lk], True where query i (the last n_query of n_key positions) may see key j."""
    rows = torch.arange(n_key - n_query, n_key, device=device)[:, None]
    return torch.arange(n_key, device=device)[None, :] <= rows


def attend_math(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax attention written out: q [B, H, Lq, E], k, v [B, H, Lk, E] -> [B, H, Lq, E].

    The queries are the last Lq positions of the Lk keys (Lq < Lk when continuing from a KV cache).
    """
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, H, Lq, Lk]
    scores = scores.masked_fill(~_causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def attend_sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The same as `attend_math` through torch's fused scaled_dot_product_attention (flash kernels on a GPU)."""
    n_query, n_key = q.shape[-2], k.shape[-2]
    if n_query == n_key:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if n_query == 1:  # one decode token sees every cached key: no mask, so the flash kernel stays eligible
        return F.scaled_dot_product_attention(q, k, v)
    # SDPA's is_causal aligns the mask top-left; a query block continuing a cache needs it bottom-right.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_mask(n_query, n_key, q.device))


ATTENTION_BACKENDS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {"sdpa": attend_sdpa, "math": attend_math}


class Attention(Mixer):
    """Multi-head causal self-attention with RoPE and a KV-cache state.

    Parameters: W_qkv [3D, D] and W_out [D, D], no biases: 4·D² per layer.

    Args:
        d_model: model width D.
        layer_idx: position of this layer in the stack (unused by the math; kept for the mixer contract).
        n_heads: number of heads H; D must be divisible by H and the head width E = D/H must be even (RoPE).
        rope_theta: RoPE base θ (10,000 as in RoFormer and Llama).
        backend: softmax implementation, "sdpa" (default; FlashAttention on a GPU) or "math" (plain torch oracle).
    """

    def __init__(
        self, d_model: int, layer_idx: int = 0, *, n_heads: int = 8, rope_theta: float = 10_000.0, backend: str = "sdpa"
    ):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"attention: d_model={d_model} is not divisible by n_heads={n_heads}")
        if (d_model // n_heads) % 2:
            raise ValueError(f"attention: head width d_model/n_heads={d_model // n_heads} must be even for RoPE")
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention: unknown backend {backend!r}; valid: {sorted(ATTENTION_BACKENDS)}")
        self.d_model, self.layer_idx, self.n_heads = d_model, layer_idx, n_heads
        self.head_dim = d_model // n_heads
        self.rope_theta, self.backend = rope_theta, backend
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> KVCache:
        """An empty KV cache (T = 0) for a fresh sequence."""
        empty = torch.zeros(batch_size, self.n_heads, 0, self.head_dim, device=device, dtype=dtype)
        return KVCache(empty, empty.clone())

    def forward(self, x: Tensor, state: KVCache | None = None) -> tuple[Tensor, KVCache]:
        """Attend causally over the cached tokens and x.

        Args:
            x: input, [B, L, D].
            state: KV cache of the T tokens before x (each [B, H, T, E]), or None for a fresh sequence.

        Returns:
            (y [B, L, D], KV cache of all T + L tokens).
        """
        batch, length, _ = x.shape
        offset = 0 if state is None else state.k.shape[-2]
        qkv = self.qkv_proj(x).view(batch, length, 3, self.n_heads, self.head_dim)  # [B, L, 3, H, E]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, L, E]
        q, k = rotary(q, offset, self.rope_theta), rotary(k, offset, self.rope_theta)
        if state is not None:
            k, v = torch.cat((state.k, k), dim=-2), torch.cat((state.v, v), dim=-2)  # [B, H, T+L, E]
        o = ATTENTION_BACKENDS[self.backend](q, k, v)  # [B, H, L, E]
        y = self.out_proj(o.transpose(1, 2).reshape(batch, length, self.d_model))  # [B, L, D]
        return y, KVCache(k, v)
