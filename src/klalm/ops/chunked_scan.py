"""Parallel KLA scan in plain PyTorch (CPU and GPU) with a hand-derived exact backward.

The filter (docs/kla.md, "The math") per (b, m, s), for t = 1..L from (λ_0, η_0):

    φ_t = Λ_t·k_t²   r_t = v_t·Λ_t·k_t   d_t = a² + p·λ_{t-1}   g_t = a/d_t
    λ_t = λ_{t-1}/d_t + φ_t              η_t = g_t·η_{t-1} + r_t

Forward: a two-level (chunked) scan. Time is cut into NC chunks of C steps, stored time-major as
[C, B, NC, ...], so one step of every chunk is one contiguous slice; every pass loops over the C steps
of all chunks at once, or over the NC chunk boundaries, never over all L steps:

1. λ entering each chunk. λ_t is the Möbius map λ ↦ (A·λ + B)/(C·λ + D) of λ_{t-1} with the matrix
   [[1 + p·φ_t, a²·φ_t], [p, a²]] (the design's (A, B, C, D) times a², so nothing divides by a). Each
   chunk's 2×2 product is accumulated and renormalised by the sum of its four non-negative entries (a
   matrix and its multiples are the same map), so it neither under- nor overflows; the chunk products
   then carry λ across the NC boundaries.
2. η entering each chunk. η is a first-order affine recurrence with gain g_t: per chunk the running
   (gain product, local value) pair from the exact λ starts, then the carry across chunks. Products only
   multiply (no cumprod-then-divide), so a vanishing gain underflows harmlessly to 0.
3. Every chunk reruns the plain recursion from its exact start state and reads out y and y_var.

With one chunk (C = L) passes 1 and 2 vanish and the forward is the sequential recursion; the default
chunk size (`default_chunk_size`) picks that on CPU when one step already has enough elements to keep
the cores busy, and C = ceil(√L) otherwise (always on GPU).

Backward (exact, derived by hand; tests compare it with autograd through the sequential reference).
With e_t = ∂ℓ/∂η_t and f_t = ∂ℓ/∂λ_t through the readout at t alone (plus the final-state gradients at
t = L), the total adjoints obey two coupled reverse recursions:

    Hη_t = e_t + g_{t+1}·Hη_{t+1}
    Hλ_t = f_t − (a·p/d_{t+1}²)·η_t·Hη_{t+1} + (a²/d_{t+1}²)·Hλ_{t+1}

i.e. the adjoint entering state t-1 from step t is the lower-triangular affine map
(Pη, Pλ)_{t-1} = [[g_t, 0], [−c_t, w_t]]·(Hη_t, Hλ_t) with w_t = a²/d_t², c_t = a·p·η_{t-1}/d_t².
They run as the same two-level scan in reverse (chunk maps of (Pη, Pλ), carry, exact rerun). Then,
with u_t = (λ_{t-1}·Hλ_t + a·η_{t-1}·Hη_t)/d_t²:
∂v_t = Λ_t·Σ_s Hη_t·k_t, ∂Λ_t = Σ_s (Hλ_t·k_t² + Hη_t·v_t·k_t), ∂k_t = Σ_m Λ_t·(2·k_t·Hλ_t + v_t·Hη_t),
∂q_t = Σ_m (∂y_t·μ_t + 2·q_t·∂y_var_t·σ²_t), ∂a = Σ_{b,t} (Hη_t·η_{t-1}/d_t − 2·a·u_t),
∂p = −Σ_{b,t} λ_{t-1}·u_t, and (∂λ_0, ∂η_0) = (Pλ_0, Pη_0), plus the direct readout terms of
`decode_from_prior` (μ' = a·μ, σ'² = a²·σ² + p). Memory: the forward saves the inputs and the chunk
start states ([B, NC, M, S] each); the backward recomputes λ and η ([B, L, M, S] each, transient).
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from klalm.ops.common import KLAState, compute_dtype, fresh_state

log = logging.getLogger(__name__)

# On CPU a single chunk (the sequential recursion, work-optimal) wins once one time step has this many
# (b, m, s) elements: the few-µs dispatch of each op is then small against the arithmetic of a step.
# Measured (L=1024, one thread, fwd+bwd): B·M·S = 4096: 32 chunks 264 ms vs one chunk 714 ms;
# B·M·S = 8192: 32 chunks 723 ms vs one chunk 495 ms (docs/kla.md).
CPU_SEQUENTIAL_MIN_ELEMENTS = 1 << 13
_CHUNK_RULE_LOGGED: set[str] = set()


def default_chunk_size(length: int, step_elements: int, device: torch.device) -> int:
    """Steps per chunk C: L on CPU when B·M·S ≥ CPU_SEQUENTIAL_MIN_ELEMENTS, else ceil(√L) (rule logged once)."""
    on_cpu = device.type == "cpu"
    if device.type not in _CHUNK_RULE_LOGGED:
        _CHUNK_RULE_LOGGED.add(device.type)
        rule = f"one chunk when B*M*S >= {CPU_SEQUENTIAL_MIN_ELEMENTS}, else " if on_cpu else ""
        log.info("kla_scan torch backend on %s: %sceil(sqrt(L)) steps per chunk", device.type, rule)
    if on_cpu and step_elements >= CPU_SEQUENTIAL_MIN_ELEMENTS:
        return length
    return max(1, math.ceil(math.sqrt(length)))


class Chunked(NamedTuple):
    """Inputs in time-major chunks: v, lam_v [C, B, NC, M]; k, q [C, B, NC, S]; a, p [M, S]."""

    v: Tensor
    lam_v: Tensor
    k: Tensor
    q: Tensor
    a: Tensor
    p: Tensor


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


def _phi(x: Chunked, c: int) -> Tensor:
    """φ = Λ·k² at step c of every chunk, [B, NC, M, S]."""
    return x.lam_v[c][..., None] * (x.k[c] * x.k[c])[..., None, :]


def _r(x: Chunked, c: int) -> Tensor:
    """r = v·Λ·k at step c of every chunk, [B, NC, M, S]."""
    return (x.v[c] * x.lam_v[c])[..., None] * x.k[c][..., None, :]


# The two contractions below are a product and a sum, not a (batched) matmul: on a CPU shared with other
# processes, torch's threaded bmm of these thin shapes measured ~850x slower (12 ms vs 14 µs per call).


def _rowsum(h: Tensor, w: Tensor) -> Tensor:
    """Σ_s h·w for h [B, NC, M, S], w [B, NC, S] -> [B, NC, M]."""
    return (h * w[..., None, :]).sum(-1)


def _colsum(w: Tensor, h: Tensor) -> Tensor:
    """Σ_m w·h for w [B, NC, M], h [B, NC, M, S] -> [B, NC, S]."""
    return (w[..., None] * h).sum(-2)


def _lambda_starts(x: Chunked, lam0: Tensor) -> Tensor:
    """λ entering every chunk, [B, NC, M, S]: per-chunk Möbius products, then the carry across chunks."""
    chunk, batch, n_chunks = x.v.shape[:3]
    if n_chunks == 1:
        return lam0[:, None]
    a, p = x.a, x.p
    a2 = a * a
    shape = (batch, n_chunks, *a.shape)
    ta, tb = lam0.new_ones(shape), lam0.new_zeros(shape)  # chunk product, starts as the identity
    tc, td = lam0.new_zeros(shape), lam0.new_ones(shape)
    for c in range(chunk):  # leaf [[1 + pφ, a²φ], [p, a²]] times the running product
        phi = _phi(x, c)
        la, lb = 1 + p * phi, a2 * phi
        ta, tb, tc, td = la * ta + lb * tc, la * tb + lb * td, p * ta + a2 * tc, p * tb + a2 * td
        inv_norm = (ta + tb + tc + td).reciprocal_()
        ta, tb, tc, td = ta * inv_norm, tb * inv_norm, tc * inv_norm, td * inv_norm
    starts = [lam0]
    for n in range(n_chunks - 1):
        s = starts[-1]
        starts.append((ta[:, n] * s + tb[:, n]) / (tc[:, n] * s + td[:, n]))
    return torch.stack(starts, 1)


def _eta_starts(x: Chunked, lam_starts: Tensor, eta0: Tensor) -> Tensor:
    """η entering every chunk, [B, NC, M, S]: per-chunk affine maps (gain product, local value), then the carry."""
    chunk, _, n_chunks = x.v.shape[:3]
    if n_chunks == 1:
        return eta0[:, None]
    a2 = x.a * x.a
    lam, g_run, r_run = lam_starts, torch.ones_like(lam_starts), torch.zeros_like(lam_starts)
    for c in range(chunk):
        d = torch.addcmul(a2, x.p, lam)
        gain = x.a / d
        g_run, r_run = gain * g_run, torch.addcmul(_r(x, c), gain, r_run)
        lam = torch.addcdiv(_phi(x, c), lam, d)
    starts = [eta0]
    for n in range(n_chunks - 1):
        starts.append(g_run[:, n] * starts[-1] + r_run[:, n])
    return torch.stack(starts, 1)


def _readout_sweep(x: Chunked, lam: Tensor, eta: Tensor, prior: bool, length: int):
    """Rerun every chunk from its exact start; y, y_var [C, B, NC, M] and the state after step L."""
    chunk = x.v.shape[0]
    a, p = x.a, x.p
    a2 = a * a
    y, y_var = x.v.new_empty(x.v.shape), x.v.new_empty(x.v.shape)
    last_c, last_n = (length - 1) % chunk, (length - 1) // chunk
    for c in range(chunk):
        d = torch.addcmul(a2, p, lam)
        eta = torch.addcmul(_r(x, c), a / d, eta)
        lam = torch.addcdiv(_phi(x, c), lam, d)
        var = lam.reciprocal()
        mean = eta * var
        if prior:
            mean, var = a * mean, torch.addcmul(p, a2, var)
        y[c], y_var[c] = _rowsum(mean, x.q[c]), _rowsum(var, x.q[c] * x.q[c])
        if c == last_c:
            final = KLAState(lam[:, last_n], eta[:, last_n])
    return y, y_var, final


def _refill(x: Chunked, lam_starts: Tensor, eta_starts: Tensor) -> tuple[Tensor, Tensor]:
    """λ_t and η_t at every step, [C, B, NC, M, S] each, rerun from the chunk start states."""
    a2 = x.a * x.a
    lam_all = lam_starts.new_empty(x.v.shape[0], *lam_starts.shape)
    eta_all = torch.empty_like(lam_all)
    lam, eta = lam_starts, eta_starts
    for c in range(x.v.shape[0]):
        d = torch.addcmul(a2, x.p, lam)
        eta = torch.addcmul(_r(x, c), x.a / d, eta)
        lam = torch.addcdiv(_phi(x, c), lam, d)
        lam_all[c], eta_all[c] = lam, eta
    return lam_all, eta_all


class _Step(NamedTuple):
    """Per-step backward terms, [B, NC, M, S] each (see the module docstring)."""

    e: Tensor  # ∂ℓ/∂η_t through the readout (and final state) alone
    f: Tensor  # ∂ℓ/∂λ_t through the readout (and final state) alone
    gain: Tensor  # g_t = a/d_t
    w: Tensor  # a²/d_t²
    c: Tensor  # a·p·η_{t-1}/d_t²
    inv_d: Tensor  # 1/d_t
    inv_d2: Tensor  # 1/d_t²
    lam_prev: Tensor
    eta_prev: Tensor
    mean: Tensor  # readout mean per state (a·μ with decode_from_prior)
    var: Tensor  # readout variance per state


class _Adjoint(NamedTuple):
    """Everything the reverse sweeps read: chunked inputs, recomputed paths, upstream gradients."""

    x: Chunked
    lam: Tensor  # [C, B, NC, M, S]
    eta: Tensor
    lam_starts: Tensor  # [B, NC, M, S]
    eta_starts: Tensor
    gy: Tensor  # [C, B, NC, M]
    gy_var: Tensor | None  # None: y_var unused (its terms are skipped)
    g_lam: Tensor | None  # [B, M, S]: gradient of the final state, None when unused
    g_eta: Tensor | None
    prior: bool
    length: int
    a2: Tensor  # a², [M, S]
    ap: Tensor  # a·p, [M, S]


def _step_terms(s: _Adjoint, c: int) -> _Step:
    """The backward terms of step c of every chunk, with the final-state gradients seeded at step L."""
    a, p, a2 = s.x.a, s.x.p, s.a2
    lam_prev, eta_prev = (s.lam[c - 1], s.eta[c - 1]) if c else (s.lam_starts, s.eta_starts)
    inv = s.lam[c].reciprocal()
    q = s.x.q[c][..., None, :]  # [B, NC, 1, S]
    gy_q = s.gy[c][..., None] * q  # [B, NC, M, S]
    mean, e = s.eta[c] * inv, gy_q * inv
    if s.prior:
        mean, var, dvar = a * mean, torch.addcmul(p, a2, inv), a2 * inv
        e.mul_(a)
    else:
        var = dvar = inv
    f = gy_q.mul_(mean)
    if s.gy_var is not None:
        f.addcmul_(s.gy_var[c][..., None] * (q * q), dvar)
    f.mul_(inv).neg_()
    chunk = s.lam.shape[0]
    if c == (s.length - 1) % chunk:
        n = (s.length - 1) // chunk
        if s.g_eta is not None:
            e[:, n] += s.g_eta
        if s.g_lam is not None:
            f[:, n] += s.g_lam
    inv_d = torch.addcmul(a2, p, lam_prev).reciprocal_()
    inv_d2 = inv_d * inv_d
    return _Step(e, f, a * inv_d, a2 * inv_d2, s.ap * inv_d2 * eta_prev, inv_d, inv_d2, lam_prev, eta_prev, mean, var)


def _adjoint_carries(s: _Adjoint) -> tuple[Tensor, Tensor]:
    """(Pη, Pλ) entering every chunk's last step from the later chunks, [B, NC, M, S] each.

    Per chunk, the reverse steps compose into the lower-triangular affine map
    (Pη, Pλ)_out = [[m11, 0], [m21, m22]]·(Pη, Pλ)_in + (b1, b2); the carry chains those maps backwards.
    """
    n_chunks = s.lam.shape[2]
    zero = torch.zeros_like(s.lam_starts)
    if n_chunks == 1:
        return zero, zero
    m11, m21, m22, b1, b2 = torch.ones_like(zero), zero, torch.ones_like(zero), zero, zero
    for c in range(s.lam.shape[0] - 1, -1, -1):
        t = _step_terms(s, c)
        e1 = t.e + b1
        m21, m11, m22 = t.w * m21 - t.c * m11, t.gain * m11, t.w * m22
        b1, b2 = t.gain * e1, t.w * (t.f + b2) - t.c * e1
    p_eta, p_lam = [zero[:, 0]], [zero[:, 0]]
    for n in range(n_chunks - 1, 0, -1):
        p_eta.append(m11[:, n] * p_eta[-1] + b1[:, n])
        p_lam.append(m21[:, n] * p_eta[-2] + m22[:, n] * p_lam[-1] + b2[:, n])
    return torch.stack(p_eta[::-1], 1), torch.stack(p_lam[::-1], 1)


def _gradient_sweep(s: _Adjoint, p_eta: Tensor, p_lam: Tensor) -> tuple[Tensor, ...]:
    """Exact reverse sweep from the chunk carries: gradients of v, Λ, k, q (chunked), a, p, λ_0, η_0."""
    x, a = s.x, s.x.a
    g_v, g_lam_v, g_k, g_q = (torch.empty_like(t) for t in (x.v, x.lam_v, x.k, x.q))
    acc_a, acc_u, acc_p = (torch.zeros_like(p_eta) for _ in range(3))  # Σ Hη·η_{t-1}/d, Σ u, Σ λ_{t-1}·u
    for c in range(s.lam.shape[0] - 1, -1, -1):
        t = _step_terms(s, c)
        h_eta, h_lam = t.e.add_(p_eta), t.f.add_(p_lam)
        k = x.k[c]
        sk = _rowsum(h_eta, k)
        g_v[c] = x.lam_v[c] * sk
        g_lam_v[c] = torch.addcmul(_rowsum(h_lam, k * k), x.v[c], sk)
        g_k[c] = torch.addcmul(_colsum(x.lam_v[c] * x.v[c], h_eta), 2 * k, _colsum(x.lam_v[c], h_lam))
        g_q[c] = _colsum(s.gy[c], t.mean)
        if s.gy_var is not None:
            g_q[c].addcmul_(2 * x.q[c], _colsum(s.gy_var[c], t.var))
        u = torch.addcmul(t.lam_prev * h_lam, a * t.eta_prev, h_eta).mul_(t.inv_d2)
        acc_a.addcmul_(h_eta, t.eta_prev * t.inv_d)
        acc_u += u
        acc_p.addcmul_(t.lam_prev, u)
        if s.prior:  # direct readout terms of μ' = a·μ and σ'² = a²·σ² + p
            q = x.q[c][..., None, :]  # [B, NC, 1, S]
            inv = s.lam[c].reciprocal()
            acc_a += s.gy[c][..., None] * q * s.eta[c] * inv
            if s.gy_var is not None:
                acc_a += 2 * a * s.gy_var[c][..., None] * q * q * inv
                acc_p -= s.gy_var[c][..., None] * q * q
        p_eta, p_lam = t.gain * h_eta, torch.addcmul(t.w * h_lam, t.c, h_eta, value=-1)
    g_a = acc_a.sum((0, 1)) - 2 * a * acc_u.sum((0, 1))
    return g_v, g_lam_v, g_k, g_q, g_a, -acc_p.sum((0, 1)), p_lam[:, 0], p_eta[:, 0]


class KLAScanFunction(torch.autograd.Function):
    """Autograd wrapper: forward = chunked parallel scan, backward = the exact adjoint sweeps above.

    All tensors arrive in one compute dtype (float32 or float64); shapes as in `kla_scan_torch`.
    """

    @staticmethod
    def forward(ctx, v, lambda_v, k, q, a, p, lam0, eta0, decode_from_prior: bool, chunk: int):
        length = v.shape[1]
        x = Chunked(*(_to_chunks(t, chunk) for t in (v, lambda_v, k, q)), a, p)
        lam_starts = _lambda_starts(x, lam0)
        eta_starts = _eta_starts(x, lam_starts, eta0)
        y, y_var, final = _readout_sweep(x, lam_starts, eta_starts, decode_from_prior, length)
        ctx.save_for_backward(v, lambda_v, k, q, a, p, lam_starts, eta_starts)
        ctx.prior, ctx.chunk = decode_from_prior, chunk
        ctx.set_materialize_grads(False)  # outputs the loss does not use (y_var in training) arrive as None
        return _from_chunks(y, length), _from_chunks(y_var, length), final.lam, final.eta

    @staticmethod
    @once_differentiable
    def backward(ctx, gy, gy_var, g_lam, g_eta):
        v, lambda_v, k, q, a, p, lam_starts, eta_starts = ctx.saved_tensors
        length = v.shape[1]
        x = Chunked(*(_to_chunks(t, ctx.chunk) for t in (v, lambda_v, k, q)), a, p)
        lam, eta = _refill(x, lam_starts, eta_starts)
        gy = torch.zeros_like(v) if gy is None else gy
        gyc, gvc = _to_chunks(gy, ctx.chunk), None if gy_var is None else _to_chunks(gy_var, ctx.chunk)
        s = _Adjoint(x, lam, eta, lam_starts, eta_starts, gyc, gvc, g_lam, g_eta, ctx.prior, length, a * a, a * p)
        p_eta, p_lam = _adjoint_carries(s)
        g_v, g_lam_v, g_k, g_q, g_a, g_p, g_lam0, g_eta0 = _gradient_sweep(s, p_eta, p_lam)
        grads = [_from_chunks(t, length) for t in (g_v, g_lam_v, g_k, g_q)]
        return (*grads, g_a, g_p, g_lam0, g_eta0, None, None)


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
        chunk_size: steps per chunk C ≥ 1 (default `default_chunk_size`); every C gives the same result.

    Returns:
        (y [B, L, M], y_var [B, L, M]) in v's dtype, and the final `KLAState` in the compute dtype
        (float32; float64 for float64 inputs). Inputs are computed in that dtype whatever theirs.
    """
    out_dtype, dt = v.dtype, compute_dtype(v.dtype)
    batch, length, channels = v.shape
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if initial_state is None:
        initial_state = fresh_state(batch, channels, k.shape[-1], v.device, dt)
    if length == 0:
        return v.new_empty(v.shape), v.new_empty(v.shape), KLAState(*(t.to(dt) for t in initial_state))
    chunk = chunk_size or default_chunk_size(length, batch * channels * k.shape[-1], v.device)
    args = (t.to(dt) for t in (v, lambda_v, k, q, a, p, initial_state[0], initial_state[1]))
    y, y_var, lam, eta = KLAScanFunction.apply(*args, decode_from_prior, min(chunk, length))
    return y.to(out_dtype), y_var.to(out_dtype), KLAState(lam, eta)
