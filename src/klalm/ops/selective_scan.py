"""Mamba-1 selective scan (Gu & Dao 2023): a diagonal affine recurrence with input-dependent Δ, B, C.

    h_t = exp(Δ_t·A) ⊙ h_{t-1} + (Δ_t·u_t) ⊗ B_t        y_t = h_t · C_t + D ⊙ u_t

Shapes: u, delta [B, L, M]; A [M, N] (negative); Bm, Cm [B, L, N]; D [M]; state h [B, M, N].

Backends (`SELECTIVE_SCAN_BACKENDS`, one signature):
- "reference": the sequential loop below; the oracle.
- "torch": parallel in time. Time is cut into chunks of `SCAN_CHUNK` tokens; inside a chunk the affine
  recurrence runs as a Hillis–Steele doubling scan (log2 of the chunk length steps over [B, C, M, N] tensors,
  products of decays ≤ 1 only, so nothing overflows), and only the [B, M, N] state is carried from chunk to
  chunk. A custom autograd.Function saves the inputs and the chunk-boundary states and recomputes each
  chunk's states in the backward, where the adjoint gh_t = C_t gy_t + exp(Δ_{t+1}A) gh_{t+1} is the same
  scan run backwards; the gradients are exact (no approximation, only float rounding).
- "triton": `klalm.kernels.selective_scan.selective_scan_triton` (CUDA), imported at first use.
"auto" picks triton on CUDA tensors (torch, with a one-time warning, when the kernel module cannot be
imported) and torch otherwise; the choice is logged once.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

SCAN_CHUNK = 64  # tokens per chunk of the "torch" backend: memory is O(B·SCAN_CHUNK·M·N) per chunk


@functools.cache
def _log_once(level: int, message: str) -> None:
    logger.log(level, message)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def selective_scan_reference(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    D: Tensor | None = None,
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
        decay = torch.exp(delta[:, t, :, None] * A)  # [B, M, N]
        h = decay * h + (delta[:, t] * u[:, t])[:, :, None] * Bm[:, t, None, :]
        ys.append((h * Cm[:, t, None, :]).sum(-1))  # [B, M]
    y = torch.stack(ys, 1) if ys else u.clone()
    if D is not None:
        y = y + u * D.to(dt)
    return y.to(out_dtype), h


def _affine_scan(a: Tensor, b: Tensor, x0: Tensor, reverse: bool = False) -> Tensor:
    """Inclusive scan of x_t = a_t·x_{t−1} + b_t along dim 1 from x_{−1} = x0 (reverse: x_t = a_t·x_{t+1} + b_t
    from x_T = x0). a, b [B, T, M, N], x0 [B, M, N] -> x [B, T, M, N].

    Blocked two-level scan: T is cut into n blocks of c ≈ sqrt(T) steps; the blocks are scanned together (c steps
    over [B, n, M, N]), then the block-boundary states are carried across blocks (n steps over [B, M, N]) and added
    back through the within-block decay products. Only products of decays (≤ 1) appear, so nothing overflows.
    """
    length = a.shape[1]
    c = math.isqrt(length - 1) + 1 if length > 1 else 1
    pad = -length % c  # padding steps (a = 1, b = 0) go at the end; they never feed a real step's value
    if pad:
        a = torch.cat([a, a.new_ones(a.shape[0], pad, *a.shape[2:])], 1)
        b = torch.cat([b, b.new_zeros(b.shape[0], pad, *b.shape[2:])], 1)
    a, b = a.unflatten(1, (-1, c)), b.unflatten(1, (-1, c))  # [B, n, c, M, N]
    steps = range(c - 1, -1, -1) if reverse else range(c)
    out, prod = torch.empty_like(b), torch.empty_like(a)  # local states; decay from the block's entry to j
    x, p = torch.zeros_like(b[:, :, 0]), torch.ones_like(a[:, :, 0])  # [B, n, M, N]
    for j in steps:
        x = out[:, :, j] = torch.addcmul(b[:, :, j], a[:, :, j], x)
        p = prod[:, :, j] = p * a[:, :, j]
    entry, s = torch.empty_like(x), x0  # state entering each block, [B, n, M, N]; running state [B, M, N]
    last = steps[-1]
    for i in reversed(range(a.shape[1])) if reverse else range(a.shape[1]):
        entry[:, i] = s
        s = torch.addcmul(out[:, i, last], prod[:, i, last], s)
    out += prod * entry[:, :, None]
    return out.flatten(1, 2)[:, :length]  # [B, T, M, N]


def _chunk_terms(u: Tensor, delta: Tensor, A: Tensor, Bm: Tensor, h0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Decays exp(Δ_t A), drives (Δ_t u_t) ⊗ B_t and states h_t of one chunk, each [B, T, M, N].

    u, delta [B, T, M]; A [M, N]; Bm [B, T, N]; h0 [B, M, N] (the state before the chunk).
    """
    decay = torch.exp(delta[..., None] * A)
    drive = (delta * u)[..., None] * Bm[:, :, None, :]
    return decay, drive, _affine_scan(decay, drive, h0)


class _SelectiveScanFn(torch.autograd.Function):
    """Chunked parallel selective scan without D (the skip is added outside); see the module docstring."""

    @staticmethod
    def forward(ctx, u, delta, A, Bm, Cm, h0, chunk):
        ys, starts, h = [], [], h0
        for t0 in range(0, u.shape[1], chunk):
            sl = slice(t0, t0 + chunk)
            starts.append(h)
            hs = _chunk_terms(u[:, sl], delta[:, sl], A, Bm[:, sl], h)[2]  # [B, T, M, N]
            ys.append(torch.einsum("btmn,btn->btm", hs, Cm[:, sl]))
            h = hs[:, -1]
        ctx.save_for_backward(u, delta, A, Bm, Cm, *starts)
        ctx.chunk = chunk
        return torch.cat(ys, 1), h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy, gh_last):
        u, delta, A, Bm, Cm, *starts = ctx.saved_tensors
        chunk = ctx.chunk
        g_u, g_delta, g_b, g_c = (torch.empty_like(x) for x in (u, delta, Bm, Cm))
        g_a = torch.zeros_like(A)
        carry = gh_last  # dLoss/dh after the chunk being processed (the final state's gradient first)
        for i in reversed(range(len(starts))):
            sl = slice(i * chunk, (i + 1) * chunk)
            u_c, d_c, b_c, gy_c = u[:, sl], delta[:, sl], Bm[:, sl], gy[:, sl]
            decay, drive, hs = _chunk_terms(u_c, d_c, A, b_c, starts[i])
            # adjoint: gh_t = C_t gy_t + exp(Δ_{t+1}A) gh_{t+1}, entering the chunk's last step with the carry
            next_decay = torch.cat([decay[:, 1:], torch.ones_like(decay[:, :1])], 1)
            direct = gy_c[..., None] * Cm[:, sl, None, :]  # [B, T, M, N]
            gh = _affine_scan(next_decay, direct, carry, reverse=True)  # [B, T, M, N]
            carry = decay[:, 0] * gh[:, 0]
            g_c[:, sl] = torch.einsum("btmn,btm->btn", hs, gy_c)
            g_log_decay = gh * (hs - drive)  # d/d(Δ_t A): gh_t · exp(Δ_t A) h_{t−1}
            g_a += torch.einsum("btmn,btm->mn", g_log_decay, d_c)
            g_drive = torch.einsum("btmn,btn->btm", gh, b_c)  # d/d(Δ_t u_t)
            g_b[:, sl] = torch.einsum("btmn,btm->btn", gh, d_c * u_c)
            g_u[:, sl] = g_drive * d_c
            g_delta[:, sl] = g_drive * u_c + torch.einsum("btmn,mn->btm", g_log_decay, A)
        return g_u, g_delta, g_a, g_b, g_c, carry, None


def selective_scan_torch(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
    chunk_size: int = SCAN_CHUNK,
) -> tuple[Tensor, Tensor]:
    """Parallel-in-time scan with exact gradients (module docstring); same returns as the reference."""
    out_dtype, dt = u.dtype, _compute_dtype(u.dtype)
    u, delta, A, Bm, Cm = (x.to(dt) for x in (u, delta, A, Bm, Cm))
    h0 = u.new_zeros(u.shape[0], u.shape[2], A.shape[-1]) if initial_state is None else initial_state.to(dt)
    if u.shape[1] == 0:
        return u.to(out_dtype).clone(), h0
    with torch.autocast(u.device.type, enabled=False):  # the scan runs in float32 whatever the autocast
        y, h = _SelectiveScanFn.apply(u, delta, A, Bm, Cm, h0, chunk_size)
    if D is not None:
        y = y + u * D.to(dt)
    return y.to(out_dtype), h


def _selective_scan_triton(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The Triton kernel (CUDA only), imported at first use; its oracle is `selective_scan_reference`."""
    if not u.is_cuda:
        raise ValueError(f"selective_scan backend 'triton' needs CUDA tensors, got u on {u.device}")
    return _load_triton()(u, delta, A, Bm, Cm, D, initial_state)


@functools.cache
def _load_triton() -> Callable:
    try:
        from klalm.kernels.selective_scan import selective_scan_triton
    except ImportError as err:
        raise ImportError(
            f"selective_scan backend 'triton' needs klalm.kernels.selective_scan.selective_scan_triton: {err}"
        ) from err
    return selective_scan_triton


SELECTIVE_SCAN_BACKENDS: dict[str, Callable] = {
    "reference": selective_scan_reference,
    "torch": selective_scan_torch,
    "triton": _selective_scan_triton,
}


def _resolve_backend(backend: str, device: torch.device) -> str:
    if backend != "auto":
        if backend not in SELECTIVE_SCAN_BACKENDS:
            valid = sorted(SELECTIVE_SCAN_BACKENDS) + ["auto"]
            raise ValueError(f"unknown selective_scan backend {backend!r}; valid: {valid}")
        return backend
    if device.type != "cuda":
        _log_once(logging.INFO, f"selective_scan backend 'auto' on {device.type}: using 'torch'")
        return "torch"
    try:
        _load_triton()
    except ImportError as err:
        _log_once(logging.WARNING, f"selective_scan backend 'auto' on {device}: using 'torch' ({err})")
        return "torch"
    _log_once(logging.INFO, f"selective_scan backend 'auto' on {device}: using 'triton'")
    return "triton"


def _check_inputs(u, delta, A, Bm, Cm, D, initial_state) -> None:
    if u.dim() != 3:
        raise ValueError(f"u must be [B, L, M], got {tuple(u.shape)}")
    batch, length, channels = u.shape
    want = {
        "delta": (delta, (batch, length, channels)),
        "A": (A, (channels, A.shape[-1])),
        "Bm": (Bm, (batch, length, A.shape[-1])),
        "Cm": (Cm, (batch, length, A.shape[-1])),
        "D": (D, (channels,)),
        "initial_state": (initial_state, (batch, channels, A.shape[-1])),
    }
    for name, (x, shape) in want.items():
        if x is not None and tuple(x.shape) != shape:
            raise ValueError(f"selective_scan: {name} must have shape {shape}, got {tuple(x.shape)}")
        if x is not None and not x.is_floating_point():
            raise ValueError(f"selective_scan: {name} must be floating point, got {x.dtype}")


def selective_scan(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Selective scan with a choice of backend.

    Args:
        u: inputs, [B, L, M]; any float dtype (computed in float32, float64 stays float64).
        delta: step sizes Δ (after softplus), [B, L, M], > 0.
        A: continuous state matrix (diagonal), [M, N], < 0.
        Bm: input map, [B, L, N].
        Cm: readout, [B, L, N].
        D: skip weight, [M], or None for no skip.
        initial_state: state h_0, [B, M, N]; zeros when None.
        backend: "reference", "torch", "triton" or "auto" (triton on CUDA, torch otherwise; logged once).

    Returns:
        (y [B, L, M] in u's dtype, final state h [B, M, N] in the compute dtype). Differentiable in every
        tensor argument.
    """
    _check_inputs(u, delta, A, Bm, Cm, D, initial_state)
    name = _resolve_backend(backend, u.device)
    return SELECTIVE_SCAN_BACKENDS[name](u, delta, A, Bm, Cm, D, initial_state)
