"""Mamba-1 selective scan (Gu & Dao 2023): a diagonal affine recurrence with input-dependent Δ, B, C.

    h_t = exp(Δ_t·A) ⊙ h_{t-1} + (Δ_t·u_t) ⊗ B_t        y_t = h_t · C_t + D ⊙ u_t

Shapes: u, delta [B, L, M]; A [M, N] (negative); Bm, Cm [B, L, N]; D [M]; state h [B, M, N].

Backends (`SELECTIVE_SCAN_BACKENDS`, one signature):
- "reference": the sequential loop below; the oracle.
- "torch": parallel in time. Time is cut into chunks of `SCAN_CHUNK` tokens, and each chunk into n ≈ sqrt(C)
  blocks of c ≈ sqrt(C) steps that are scanned side by side (a two-level blocked scan: c + n + c sequential
  steps per chunk instead of C, on tensors stored step-major so every step touches one contiguous slab). Only
  products of decays ≤ 1 appear, so nothing overflows, and only the [B, M, N] state crosses chunk borders, so
  memory is O(B·C·M·N) however long the sequence. A custom autograd.Function saves the inputs and the
  chunk-entry states and recomputes each chunk's states in the backward, where the adjoint
  gh_t = C_t gy_t + exp(Δ_{t+1}A) gh_{t+1} is the same scan run backwards; the gradients are exact (no
  approximation, only float rounding).
- "triton": `klalm.kernels.selective_scan.selective_scan_triton` (CUDA; on CPU under Triton's interpreter), imported
  at first use; torch custom ops, so torch.compile traces through it.
"auto" picks triton for CUDA tensors below float64 when the kernel imports, and torch otherwise (the policy of all
three ops, in `klalm.ops.backends`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from klalm.ops.backends import OpBackends, resolve_backend
from klalm.ops.common import compute_dtype

SCAN_CHUNK = 64  # tokens per chunk of the "torch" backend: memory is O(B·SCAN_CHUNK·M·N) per chunk


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
    dt = compute_dtype(u.dtype)
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


class _Blocks(NamedTuple):
    """How time is laid out for the "torch" backend: L (zero-padded to Lp = chunks·n·c) splits into `chunks` chunks
    of n blocks of c steps; inside a chunk, the tensors are stored step-major, [c, B, n, *F], so each step of the
    blocked scan reads and writes one contiguous [B, n, *F] slab."""

    chunks: int
    n: int
    c: int

    @classmethod
    def plan(cls, length: int, chunk_size: int) -> _Blocks:
        span = min(chunk_size, length)
        # c = ⌈√span⌉ steps within a block, n blocks, both ~√span (math.sqrt, not math.isqrt: dynamo traces it with
        # symbolic sizes, where isqrt broke the compiled graph)
        c = math.ceil(math.sqrt(span))
        n = -(-span // c)
        return cls(-(-length // (n * c)), n, c)

    def split(self, x: Tensor) -> Tensor:
        """[B, L, F] -> [chunks, c, B, n, F], zero-padded at the end (Δ = 0 is an identity step: decay 1, drive 0)."""
        pad = self.chunks * self.n * self.c - x.shape[1]
        if pad:
            x = torch.cat([x, x.new_zeros(x.shape[0], pad, x.shape[2])], 1)
        x = x.reshape(x.shape[0], self.chunks, self.n, self.c, x.shape[2])  # [B, chunks, n, c, F]
        return x.permute(1, 3, 0, 2, 4).contiguous()  # [chunks, c, B, n, F]

    def merge(self, x: Tensor, length: int) -> Tensor:
        """[chunks, c, B, n, F] -> [B, L, F] (the inverse of `split`, padding dropped)."""
        x = x.permute(2, 0, 3, 1, 4)  # [B, chunks, n, c, F]
        return x.reshape(x.shape[0], -1, x.shape[-1])[:, :length]


def _affine_scan(delta: Tensor, A: Tensor, b: Tensor, x0: Tensor, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """Scan x_j = a_j·x_{j−1} + b_j with a_j = exp(Δ_j A) over one chunk from x_{−1} = x0 (reverse:
    x_j = a_j·x_{j+1} + b_j from x0 after the chunk's end). delta [c, B, n, M] and b [c, B, n, M, N] are step-major
    (`_Blocks`); A [M, N]; x0 [B, M, N].

    Two-level: the n blocks are scanned side by side from zero (c steps over [B, n, M, N]), the block-entry states
    are carried across blocks with each block's total decay exp(A·ΣΔ) (n steps over [B, M, N]), and a second pass
    re-runs the blocks from their entry states. Every decay is ≤ 1, so nothing overflows.
    Returns (x [c, B, n, M, N], the state after the chunk's last step in scan order [B, M, N]).
    """
    a = torch.exp(delta[..., None] * A)  # [c, B, n, M, N]
    block_decay = torch.exp(delta.sum(0)[..., None] * A)  # [B, n, M, N]
    steps = range(a.shape[0] - 1, -1, -1) if reverse else range(a.shape[0])
    x = torch.zeros_like(b[0])  # [B, n, M, N]
    for j in steps:
        x = torch.addcmul(b[j], a[j], x)
    entry, s = torch.empty_like(x), x0  # the state entering each block, [B, n, M, N]; running state [B, M, N]
    for i in reversed(range(a.shape[2])) if reverse else range(a.shape[2]):
        entry[:, i] = s
        s = torch.addcmul(x[:, i], block_decay[:, i], s)
    out, x = torch.empty_like(b), entry
    for j in steps:
        x = torch.addcmul(b[j], a[j], x, out=out[j])
    return out, s


def _chunk_terms(u: Tensor, delta: Tensor, A: Tensor, Bm: Tensor, h0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Drives (Δ_t u_t) ⊗ B_t and states h_t of one chunk, each [c, B, n, M, N], and the state after the chunk
    [B, M, N]. u, delta [c, B, n, M]; A [M, N]; Bm [c, B, n, N]; h0 [B, M, N] (the state before the chunk).
    """
    drive = (delta * u)[..., None] * Bm[..., None, :]
    return drive, *_affine_scan(delta, A, drive, h0)


class _SelectiveScanFn(torch.autograd.Function):
    """Chunked parallel selective scan without D (the skip is added outside); see the module docstring."""

    @staticmethod
    def forward(ctx, u, delta, A, Bm, Cm, h0, chunk_size):
        blocks = _Blocks.plan(u.shape[1], chunk_size)
        u_b, d_b, b_b, c_b = (blocks.split(x) for x in (u, delta, Bm, Cm))  # [chunks, c, B, n, M | N]
        ys, starts, h = torch.empty_like(u_b), [], h0
        for k in range(blocks.chunks):
            starts.append(h)
            _, hs, h = _chunk_terms(u_b[k], d_b[k], A, b_b[k], h)  # [c, B, n, M, N]
            ys[k] = torch.einsum("jbimn,jbin->jbim", hs, c_b[k])
        ctx.save_for_backward(u_b, d_b, A, b_b, c_b, torch.stack(starts), delta)
        ctx.blocks, ctx.length = blocks, u.shape[1]
        return blocks.merge(ys, u.shape[1]), h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy, gh_last):
        u_b, d_b, A, b_b, c_b, starts, delta = ctx.saved_tensors
        blocks, length = ctx.blocks, ctx.length
        # adjoint: gh_t = C_t gy_t + exp(Δ_{t+1}A) gh_{t+1}, with Δ_L = 0 so the final state's gradient enters as is
        d_next = blocks.split(torch.nn.functional.pad(delta[:, 1:], (0, 0, 0, 1)))  # [chunks, c, B, n, M]: Δ_{t+1}
        gy_b = blocks.split(gy)
        g_u, g_d, g_b, g_c = (torch.empty_like(x) for x in (u_b, d_b, b_b, c_b))
        g_a, carry = torch.zeros_like(A), gh_last  # carry: dLoss/dh at the step after the current chunk
        for k in reversed(range(blocks.chunks)):
            u_k, d_k, b_k, gy_k = u_b[k], d_b[k], b_b[k], gy_b[k]
            drive, hs, _ = _chunk_terms(u_k, d_k, A, b_k, starts[k])
            direct = gy_k[..., None] * c_b[k][..., None, :]  # [c, B, n, M, N]
            gh, carry = _affine_scan(d_next[k], A, direct, carry, reverse=True)
            g_c[k] = torch.einsum("jbimn,jbim->jbin", hs, gy_k)
            g_log_decay = gh * (hs - drive)  # d/d(Δ_t A) = gh_t · exp(Δ_t A) h_{t−1}
            g_a += torch.einsum("jbimn,jbim->mn", g_log_decay, d_k)
            g_drive = torch.einsum("jbimn,jbin->jbim", gh, b_k)  # d/d(Δ_t u_t)
            g_b[k] = torch.einsum("jbimn,jbim->jbin", gh, d_k * u_k)
            torch.mul(g_drive, d_k, out=g_u[k])
            torch.addcmul(torch.einsum("jbimn,mn->jbim", g_log_decay, A), g_drive, u_k, out=g_d[k])
        g_h0 = carry * torch.exp(d_b[0, 0, :, 0, :, None] * A)  # dLoss/dh_{−1} = exp(Δ_0 A) gh_0
        g_u, g_d, g_b, g_c = (blocks.merge(x, length) for x in (g_u, g_d, g_b, g_c))
        return g_u, g_d, g_a, g_b, g_c, g_h0, None


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
    out_dtype, dt = u.dtype, compute_dtype(u.dtype)
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
    """The Triton kernel, imported at first use; its oracle is `selective_scan_reference`. It needs CUDA tensors (or
    Triton's CPU interpreter, TRITON_INTERPRET=1); `selective_scan_triton` raises a ValueError otherwise."""
    return _load_triton()(u, delta, A, Bm, Cm, D, initial_state)


def _load_triton() -> Callable:
    """The Triton entry point (a plain import statement: torch.compile traces through it without a graph break)."""
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


def _triton_usable(device: torch.device) -> tuple[bool, str]:
    """Whether the Triton kernel imports (the "auto" test of `klalm.ops.backends`)."""
    try:
        _load_triton()
    except ImportError as err:
        return False, str(err)
    return True, "the Triton kernel imports"


SELECTIVE_SCAN_OP = OpBackends("selective_scan", SELECTIVE_SCAN_BACKENDS, fast="triton", usable=_triton_usable)


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
        backend: "reference", "torch", "triton" or "auto" (`klalm.ops.backends` says what it picks).

    Returns:
        (y [B, L, M] in u's dtype, final state h [B, M, N] in the compute dtype). Differentiable in every
        tensor argument.
    """
    _check_inputs(u, delta, A, Bm, Cm, D, initial_state)
    name = resolve_backend(SELECTIVE_SCAN_OP, backend, u.device, u.dtype)
    return SELECTIVE_SCAN_BACKENDS[name](u, delta, A, Bm, Cm, D, initial_state)
