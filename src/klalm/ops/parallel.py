"""Parallel KLA scan in plain PyTorch (CPU and GPU) with a hand-derived exact backward.

The filter (shared/DESIGN.md §1) per (b, m, s), for t = 1..L from (λ_0, η_0):

    φ_t = Λ_t·k_t²   r_t = v_t·Λ_t·k_t   d_t = a² + p·λ_{t-1}   g_t = a/d_t
    λ_t = λ_{t-1}/d_t + φ_t              η_t = g_t·η_{t-1} + r_t

Forward, a two-level (chunked) scan. Time is cut into NC chunks of C ≈ √L steps, stored time-major as
[C, B, NC, M, S] so that one step of every chunk is one contiguous slice; each pass below loops over
the C steps of all chunks at once, or over the NC chunk boundaries, never over all L steps:

1. λ path. λ_t is the Möbius map λ ↦ (A·λ + B)/(C·λ + D) of λ_{t-1}, with the matrix
   [[1 + p·φ_t, a²·φ_t], [p, a²]] (the design's (A, B, C, D) times a², which avoids dividing by a).
   Per chunk the 2×2 product is accumulated and renormalised by the sum of its four non-negative entries
   (a matrix and its multiples are the same map), so nothing under- or overflows; the chunk products carry
   λ across chunk boundaries; then the plain recursion refills every λ_t from its chunk's exact start.
2. η path. A first-order affine scan with gain g_t: per chunk the running (gain product, local value) pair,
   then the carry across chunks, then η_t = G_t·η_start + R_t. Products only multiply (no cumprod-then-
   divide), so a vanishing gain underflows harmlessly to 0.

Backward (exact, derived by hand; tests compare it with autograd through the sequential reference).
With e_t = ∂ℓ/∂η_t and f_t = ∂ℓ/∂λ_t from the readout at t alone, the total adjoints are two reverse
affine scans (the second uses the first):

    Hη_t = e_t + g_{t+1}·Hη_{t+1}
    Hλ_t = f_t − (a·p/d_{t+1}²)·η_t·Hη_{t+1} + (a²/d_{t+1}²)·Hλ_{t+1}

seeded at t = L by the final-state gradients. Then, with u_t = (λ_{t-1}·Hλ_t + a·η_{t-1}·Hη_t)/d_t²:
∂v_t = Λ_t·Σ_s Hη_t·k_t, ∂Λ_t = Σ_s (Hλ_t·k_t² + Hη_t·v_t·k_t), ∂k_t = Σ_m Λ_t·(2·k_t·Hλ_t + v_t·Hη_t),
∂q_t = Σ_m (∂y_t·μ_t + 2·q_t·∂y_var_t·σ²_t), ∂a = Σ_{b,t} (Hη_t·η_{t-1}/d_t − 2·a·u_t),
∂p = −Σ_{b,t} λ_{t-1}·u_t, ∂η_0 = g_1·Hη_1, ∂λ_0 = (a²/d_1²)·Hλ_1 − (a·p/d_1²)·η_0·Hη_1, plus the
direct readout terms of `decode_from_prior` (μ' = a·μ, σ'² = a²·σ² + p). Only the inputs and the
initial state are saved for backward; the λ and η paths are recomputed there.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from klalm.ops.reference import KLAState, compute_dtype, fresh_state


def default_chunk_size(length: int) -> int:
    """C = ceil(√L): balances the C in-chunk steps against the L/C chunk-boundary steps."""
    return max(1, math.ceil(math.sqrt(length)))


def _to_chunks(x: Tensor, chunk: int) -> Tensor:
    """[B, L, X] -> time-major chunks [C, B, NC, X], zero-padded at the end to NC·C steps."""
    batch, length, width = x.shape
    n_chunks = -(-length // chunk)
    x = F.pad(x, (0, 0, 0, n_chunks * chunk - length))  # [B, NC·C, X]
    return x.view(batch, n_chunks, chunk, width).permute(2, 0, 1, 3).contiguous()  # [C, B, NC, X]


def _from_chunks(x: Tensor, length: int) -> Tensor:
    """[C, B, NC, X] -> [B, L, X], dropping the padding."""
    chunk, batch, n_chunks, width = x.shape
    return x.permute(1, 2, 0, 3).reshape(batch, n_chunks * chunk, width)[:, :length].contiguous()  # [B, L, X]


def _shift_prev(x: Tensor, first: Tensor) -> Tensor:
    """The previous step's value at every position: [C, B, NC, M, S] with `first` [B, M, S] before step 1."""
    out = torch.empty_like(x)
    out[1:] = x[:-1]
    out[0, :, 1:] = x[-1, :, :-1]
    out[0, :, 0] = first
    return out


def _shift_next(x: Tensor) -> Tensor:
    """The next step's value at every position, 0 after the last: [C, B, NC, M, S]."""
    out = torch.empty_like(x)
    out[:-1] = x[1:]
    out[-1, :, :-1] = x[0, :, 1:]
    out[-1, :, -1] = 0
    return out


def _phi(lambda_c: Tensor, k_c: Tensor) -> Tensor:
    """φ = Λ·k² for one step of every chunk: Λ [B, NC, M], k [B, NC, S] -> [B, NC, M, S]."""
    return lambda_c[..., None] * (k_c * k_c)[..., None, :]


def _lambda_starts(lambda_v: Tensor, k: Tensor, a: Tensor, p: Tensor, lam0: Tensor) -> Tensor:
    """λ entering every chunk, [B, NC, M, S], from chunked Λ [C, B, NC, M] and k [C, B, NC, S].

    Accumulates each chunk's Möbius matrix (all chunks at once, one step at a time), renormalised by the
    sum of its entries, then carries λ across the chunk boundaries with those matrices.
    """
    chunk, batch, n_chunks, _ = lambda_v.shape
    a2 = a * a
    shape = (batch, n_chunks, *a.shape)
    ta, tb = lam0.new_ones(shape), lam0.new_zeros(shape)  # chunk product, starts as the identity
    tc, td = lam0.new_zeros(shape), lam0.new_ones(shape)
    for c in range(chunk):  # leaf [[1 + pφ, a²φ], [p, a²]] times the running product
        phi = _phi(lambda_v[c], k[c])
        la, lb = 1 + p * phi, a2 * phi
        ta, tb, tc, td = la * ta + lb * tc, la * tb + lb * td, p * ta + a2 * tc, p * tb + a2 * td
        inv_norm = (ta + tb + tc + td).reciprocal_()
        ta, tb, tc, td = ta * inv_norm, tb * inv_norm, tc * inv_norm, td * inv_norm
    starts = [lam0]
    for n in range(n_chunks - 1):
        s = starts[-1]
        starts.append((ta[:, n] * s + tb[:, n]) / (tc[:, n] * s + td[:, n]))
    return torch.stack(starts, 1)


def _refill(
    v: Tensor, lambda_v: Tensor, k: Tensor, a: Tensor, p: Tensor, lam_starts: Tensor, eta_starts: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """Run the plain recursion inside every chunk from its exact start state (all chunks at once).

    Args: chunked v, Λ [C, B, NC, M], k [C, B, NC, S]; starts [B, NC, M, S] (η skipped when None).
    Returns: λ and η (or None), each [C, B, NC, M, S].
    """
    a2 = a * a
    lam = lam_starts.new_empty(v.shape[0], *lam_starts.shape)
    eta = None if eta_starts is None else torch.empty_like(lam)
    cur_lam, cur_eta = lam_starts, eta_starts
    for c in range(v.shape[0]):
        d = a2 + p * cur_lam
        if eta is not None:
            r = (v[c] * lambda_v[c])[..., None] * k[c][..., None, :]  # [B, NC, M, S]
            cur_eta = (a / d) * cur_eta + r
            eta[c] = cur_eta
        cur_lam = cur_lam / d + _phi(lambda_v[c], k[c])
        lam[c] = cur_lam
    return lam, eta


def _affine_scan(gain: Tensor, inp: Tensor, init: Tensor, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """Chunked first-order affine scan over [C, B, NC, M, S] tensors; init [B, M, S].

    Forward: h_t = gain_t·h_{t-1} + inp_t with h_0 = init. Reverse: h_t = gain_t·h_{t+1} + inp_t with
    h_{L+1} = init. Returns h [C, B, NC, M, S] and the state entering each chunk, [B, NC, M, S].
    """
    chunk, n_chunks = gain.shape[0], gain.shape[2]
    steps = range(chunk - 1, -1, -1) if reverse else range(chunk)
    prod, acc = torch.empty_like(gain), torch.empty_like(inp)
    g_run, r_run = torch.ones_like(gain[0]), torch.zeros_like(inp[0])  # [B, NC, M, S]
    for c in steps:
        g_run, r_run = gain[c] * g_run, gain[c] * r_run + inp[c]
        prod[c], acc[c] = g_run, r_run
    last = 0 if reverse else chunk - 1
    carries = [init]
    for n in range(n_chunks - 1, 0, -1) if reverse else range(n_chunks - 1):
        carries.append(prod[last, :, n] * carries[-1] + acc[last, :, n])
    if reverse:
        carries.reverse()
    carry = torch.stack(carries, 1)  # [B, NC, M, S]: the state entering each chunk
    return prod.mul_(carry).add_(acc), carry


def _final(x: Tensor, length: int) -> Tensor:
    """The value at time index length - 1 of a chunked [C, B, NC, M, S] tensor: [B, M, S]."""
    return x[(length - 1) % x.shape[0], :, (length - 1) // x.shape[0]]


def _forward_paths(v, lambda_v, k, a, p, lam0, eta0):
    """λ, η [C, B, NC, M, S] from chunked inputs, and the λ and η entering each chunk, [B, NC, M, S]."""
    lam_starts = _lambda_starts(lambda_v, k, a, p, lam0)
    lam, _ = _refill(v, lambda_v, k, a, p, lam_starts, None)
    d = a * a + p * _shift_prev(lam, lam0)
    r = (v * lambda_v)[..., None] * k[..., None, :]  # [C, B, NC, M, S]
    eta, eta_starts = _affine_scan(a / d, r, eta0)
    return lam, eta, lam_starts, eta_starts


def _readout(lam: Tensor, eta: Tensor, q: Tensor, a: Tensor, p: Tensor, prior: bool) -> tuple[Tensor, Tensor]:
    """Readout mean and variance, [C, B, NC, M] each, from λ, η [C, B, NC, M, S] and q [C, B, NC, S]."""
    var = lam.reciprocal()
    mean = eta * var
    if prior:
        mean, var = a * mean, a * a * var + p
    return torch.einsum("...ms,...s->...m", mean, q), torch.einsum("...ms,...s->...m", var, q * q)


class KLAScanFunction(torch.autograd.Function):
    """Autograd wrapper: forward = chunked parallel scan, backward = the exact adjoint scans above.

    All tensors arrive in one compute dtype (float32 or float64); shapes as in `kla_scan_torch`.
    """

    @staticmethod
    def forward(ctx, v, lambda_v, k, q, a, p, lam0, eta0, decode_from_prior: bool, chunk: int):
        length = v.shape[1]
        vc, lc, kc, qc = (_to_chunks(x, chunk) for x in (v, lambda_v, k, q))
        lam, eta, lam_starts, eta_starts = _forward_paths(vc, lc, kc, a, p, lam0, eta0)
        y, y_var = _readout(lam, eta, qc, a, p, decode_from_prior)
        ctx.save_for_backward(v, lambda_v, k, q, a, p, lam0, eta0, lam_starts, eta_starts)
        ctx.prior, ctx.chunk = decode_from_prior, chunk
        return _from_chunks(y, length), _from_chunks(y_var, length), _final(lam, length), _final(eta, length)

    @staticmethod
    @once_differentiable
    def backward(ctx, gy, gy_var, g_lam, g_eta):
        v, lambda_v, k, q, a, p, lam0, eta0, lam_starts, eta_starts = ctx.saved_tensors
        length, prior = v.shape[1], ctx.prior
        vc, lc, kc, qc, gyc, gvc = (_to_chunks(x, ctx.chunk) for x in (v, lambda_v, k, q, gy, gy_var))
        lam, eta = _refill(vc, lc, kc, a, p, lam_starts, eta_starts)
        lam_prev = _shift_prev(lam, lam0)
        d = a * a + p * lam_prev
        h_eta, h_lam, eta_prev, u = _adjoints(
            lam, lam_prev, d, eta, eta0, qc, gyc, gvc, a, p, g_lam, g_eta, prior, length
        )
        a2 = a * a
        sk = torch.einsum("...ms,...s->...m", h_eta, kc)  # Σ_s Hη·k, [C, B, NC, M]
        g_v = lc * sk
        g_lambda = torch.einsum("...ms,...s->...m", h_lam, kc * kc) + vc * sk
        g_k = 2 * kc * torch.einsum("...m,...ms->...s", lc, h_lam) + torch.einsum("...m,...ms->...s", lc * vc, h_eta)
        inv = lam.reciprocal_()  # λ is not needed after this point
        mean, var = eta * inv, inv
        if prior:
            mean, var = a * mean, a2 * var + p
        g_q = torch.einsum("...m,...ms->...s", gyc, mean) + 2 * qc * torch.einsum("...m,...ms->...s", gvc, var)
        g_a = (h_eta * eta_prev / d - 2 * a * u).sum((0, 1, 2))
        g_p = -(lam_prev * u).sum((0, 1, 2))
        if prior:  # direct readout terms of μ' = a·μ and σ'² = a²·σ² + p
            g_a = g_a + torch.einsum("cbnm,cbnms,cbns->ms", gyc, eta * inv, qc)
            g_a = g_a + 2 * a * torch.einsum("cbnm,cbnms,cbns->ms", gvc, inv, qc * qc)
            g_p = g_p + torch.einsum("cbnm,cbns->ms", gvc, qc * qc)
        d1 = d[0, :, 0]
        g_eta0 = (a / d1) * h_eta[0, :, 0]
        g_lam0 = (a2 / d1**2) * h_lam[0, :, 0] - (a * p / d1**2) * eta0 * h_eta[0, :, 0]
        grads = [_from_chunks(x, length) for x in (g_v, g_lambda, g_k, g_q)]
        return (*grads, g_a, g_p, g_lam0, g_eta0, None, None)


def _adjoints(lam, lam_prev, d, eta, eta0, qc, gyc, gvc, a, p, g_lam, g_eta, prior, length):
    """Total adjoints by the two reverse scans (module docstring), all [C, B, NC, M, S].

    Returns (Hη, Hλ, η_{t-1}, u_t = (λ_{t-1}·Hλ_t + a·η_{t-1}·Hη_t)/d_t²).
    """
    inv = 1.0 / lam
    qs = qc[..., None, :]  # [C, B, NC, 1, S]
    scale_mean, scale_var = (a, a * a) if prior else (1.0, 1.0)
    e = gyc[..., None] * qs * inv * scale_mean  # ∂ℓ/∂η_t through the readout at t only
    f = -(gyc[..., None] * qs * eta * scale_mean + gvc[..., None] * qs * qs * scale_var) * inv * inv
    del inv
    chunk = lam.shape[0]
    e[(length - 1) % chunk, :, (length - 1) // chunk] += g_eta  # final-state gradients seed the last real step
    f[(length - 1) % chunk, :, (length - 1) // chunk] += g_lam
    zero = torch.zeros_like(eta0)
    h_eta, _ = _affine_scan(_shift_next(a / d), e, zero, reverse=True)
    del e
    eta_prev = _shift_prev(eta, eta0)
    dd = d * d
    coupling = (a * p / dd) * eta_prev * h_eta  # ∂ℓ/∂λ_{t-1} through the gain of step t
    h_lam, _ = _affine_scan(_shift_next(a * a / dd), f.sub_(_shift_next(coupling)), zero, reverse=True)
    u = (lam_prev * h_lam + a * eta_prev * h_eta) / dd
    return h_eta, h_lam, eta_prev, u


def kla_scan_torch(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    initial_state: KLAState | None = None,
    decode_from_prior: bool = False,
    *,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor, KLAState]:
    """The "torch" backend of `klalm.ops.kla_scan`: chunked parallel scan with an exact custom backward.

    Args:
        v: values [B, L, M].
        lambda_v: value precisions Λ [B, L, M], > 0.
        k, q: keys and queries [B, L, S].
        a: discrete decay [M, S] in (0, 1]; p: discrete process noise [M, S], ≥ 0.
        initial_state: `KLAState(lam [B, M, S] > 0, eta [B, M, S])`, or None for λ_0 = 1, η_0 = 0.
        decode_from_prior: read out a·μ_t and a²·σ²_t + p instead of μ_t, σ²_t.
        chunk_size: steps per chunk C (default ceil(√L)); any positive value gives the same result.

    Returns:
        (y [B, L, M], y_var [B, L, M]) in v's dtype, and the final `KLAState` in the compute dtype
        (float32; float64 for float64 inputs). Inputs are computed in that dtype whatever theirs.
    """
    out_dtype, dt = v.dtype, compute_dtype(v.dtype)
    batch, length, channels = v.shape
    if initial_state is None:
        initial_state = fresh_state(batch, channels, k.shape[-1], v.device, dt)
    if length == 0:
        return v.new_empty(v.shape), v.new_empty(v.shape), KLAState(*(x.to(dt) for x in initial_state))
    chunk = chunk_size or default_chunk_size(length)
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    args = (x.to(dt) for x in (v, lambda_v, k, q, a, p, initial_state.lam, initial_state.eta))
    y, y_var, lam, eta = KLAScanFunction.apply(*args, decode_from_prior, chunk)
    return y.to(out_dtype), y_var.to(out_dtype), KLAState(lam, eta)
