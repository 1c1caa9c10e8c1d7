"""Parallel KLA scan in plain PyTorch (CPU and GPU) with a hand-derived exact backward.

The filter (docs/kla.md, "The math") runs in covariance form, P = 1/λ and μ = η/λ, per (b, m, s) for t = 1..L
from (P_0, μ_0) = (1/λ_0, η_0/λ_0):

    φ_t = Λ_t·k_t²      r_t = v_t·Λ_t·k_t      P'_t = a²·P_{t-1} + p      i_t = 1/(1 + φ_t·P'_t)
    P_t = i_t·P'_t                              μ_t = i_t·(a·μ_{t-1} + r_t·P'_t)
    y_t = Σ_s q_t·μ_t                           y_var_t = Σ_s q_t²·P_t

(with `decode_from_prior` the readout is a·μ_t and a²·P_t + p). It is the information-form recursion rewritten,
but where λ grows like a^(−2t) (p = 0, a < 1) and leaves float32's range (a = 0.9: t ≈ 421), P underflows
harmlessly towards 0, and every gain below stays bounded (0 < i_t ≤ 1, a ≤ 1). The state crosses the interface
as (λ, η): converted on entry, and returned as λ_L = 1/P_L, η_L = μ_L·λ_L (inf where λ_L is beyond the dtype's
range: the honest value; y, y_var and their gradients do not depend on it).

Forward: a two-level (chunked) scan. Time is cut into NC chunks of C steps, stored time-major as
[C, B, NC, ...], so one step of every chunk is one contiguous slice; every pass loops over the C steps
of all chunks at once, or over the NC chunk boundaries, never over all L steps:

1. P entering each chunk. P_t is the Möbius map P ↦ (A·P + B)/(C·P + D) of P_{t-1} with the matrix
   [[a², p], [φ_t·a², 1 + φ_t·p]] (nothing divides by a). Each chunk's 2×2 product is accumulated and
   renormalised by the sum of its four non-negative entries (a matrix and its multiples are the same map),
   so it neither under- nor overflows; the chunk products then carry P across the NC boundaries.
2. μ entering each chunk. μ is a first-order affine recurrence, μ_t = (a·i_t)·μ_{t-1} + r_t·P_t, with gain
   a·i_t ≤ 1: per chunk the running (gain product, local value) pair from the exact P start, then the carry
   across chunks. Products only multiply (no cumprod-then-divide), so a vanishing gain underflows to 0.
3. Every chunk reruns the plain recursion from its exact start state and reads out y and y_var.

With one chunk (C = L) passes 1 and 2 vanish and the forward is the sequential recursion; the default
chunk size (`default_chunk_size`) picks that on CPU when one step already has enough elements to keep
the cores busy, and C = ceil(√L) otherwise (always on GPU).

Backward (exact, derived by hand; tests compare it with autograd through the sequential reference). Write
step t as w_t = a·μ_{t-1} + r_t·P'_t, N_t = 1 + φ_t·P'_t, P_t = P'_t/N_t, μ_t = w_t/N_t. Let Hμ_t, HP_t be the
total adjoints ∂ℓ/∂μ_t, ∂ℓ/∂P_t, and eμ_t, eP_t their parts through the readout at t alone: eμ_t = q_t·∂y_t,
eP_t = q_t²·∂y_var_t (times a and a² with `decode_from_prior`), plus at t = L the gradients (gλ, gη) of the
returned state through (λ, η) = (1/P, μ/P): eμ_L += gη·λ_L, eP_L −= (gλ + gη·μ_L)·λ_L². The chain rule through
step t, with z_t = Hμ_t·μ_t + HP_t·P_t:

    ∂ℓ/∂w_t = Hμ_t·i_t        ∂ℓ/∂N_t = −z_t·i_t        ∂ℓ/∂r_t = Hμ_t·P_t        ∂ℓ/∂φ_t = −z_t·P_t
    gP'_t = ∂ℓ/∂P'_t = i_t·(HP_t + Hμ_t·r_t − φ_t·z_t) = i_t²·(HP_t + ν_t·Hμ_t)
    Hμ_{t-1} = eμ_{t-1} + a·i_t·Hμ_t               HP_{t-1} = eP_{t-1} + a²·gP'_t

with ν_t = r_t − a·φ_t·μ_{t-1} = Λ_t·k_t·(v_t − a·k_t·μ_{t-1}) (Λ·k times the innovation). ∂ℓ/∂r_t and ∂ℓ/∂φ_t
use P'_t·i_t = P_t; the second form of gP' uses 1 − φ_t·P_t = i_t and r_t − φ_t·μ_t = i_t·ν_t, and is the one
computed: the first cancels when φ_t·P'_t ≫ 1 (a confident token). So the adjoint handed from step t to
state t − 1 is the lower-triangular map (Hμ, HP)_t ↦ A_t·(Hμ, HP)_t with A_t = [[a·i_t, 0], [a²·i_t²·ν_t,
a²·i_t²]]: its diagonal is at most 1, and as P underflows to 0, i_t → 1 and the gains tend to a and a² (the
information-form adjoint's gain a²/(a² + p·λ)² is 1/a² there).
The reverse pass is the same two-level scan: per-chunk compositions of those affine maps (five running
tensors), the carry across chunks, then an exact rerun that produces the local gradients step by step:

    ∂v_t = Λ_t·Σ_s k_t·∂ℓ/∂r_t                    ∂Λ_t = Σ_s (k_t²·∂ℓ/∂φ_t + v_t·k_t·∂ℓ/∂r_t)
    ∂k_t = Σ_m Λ_t·(2·k_t·∂ℓ/∂φ_t + v_t·∂ℓ/∂r_t)  ∂q_t = Σ_m (∂y_t·mean_t + 2·q_t·∂y_var_t·var_t)
    ∂a = Σ_{b,t} (Hμ_t·i_t·μ_{t-1} + 2a·P_{t-1}·gP'_t)          ∂p = Σ_{b,t} gP'_t
    ∂η_0 = Hμ_0·P_0        ∂λ_0 = −P_0·(HP_0·P_0 + Hμ_0·μ_0)    with (Hμ_0, HP_0) = A_1·(Hμ_1, HP_1)

plus the direct readout terms of `decode_from_prior` (mean a·μ, variance a²·P + p): ∂a += Σ (∂y·q·μ +
2a·∂y_var·q²·P), ∂p += Σ ∂y_var·q². Memory: the forward saves the inputs and the chunk start states
([B, NC, M, S] each); the backward recomputes P and μ ([B, L, M, S] each, transient) and i_t from P_{t-1}.
The final-state seed is where the interface's (λ, η) meets the inner (P, μ), and the Triton kernels share its
two limits: −(gλ + gη·μ_L)·λ_L² overflows float32 once λ_L passes ~1.8e19, and when (gλ, gη) come back from a
next call's (λ_0, η_0) the sum cancels, so this call's ∂p (only ∂p: HP reaches every other gradient times P)
loses accuracy as λ_L grows (p = 0, λ_L ≈ 1e31: 1e-3 relative in float64, nothing left in float32). Losses of
one call's y and y_var never form the seed.
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
    if device.type not in _CHUNK_RULE_LOGGED and not torch.compiler.is_compiling():  # a log call would split a graph
        _CHUNK_RULE_LOGGED.add(device.type)
        rule = f"one chunk when B*M*S >= {CPU_SEQUENTIAL_MIN_ELEMENTS}, else " if on_cpu else ""
        log.info("kla_scan torch backend on %s: %sceil(sqrt(L)) steps per chunk", device.type, rule)
    if on_cpu and step_elements >= CPU_SEQUENTIAL_MIN_ELEMENTS:
        return length
    return max(1, math.ceil(math.sqrt(length)))


class Chunked(NamedTuple):
    """Inputs in time-major chunks: v, lam_v [C, B, NC, M]; k, q [C, B, NC, S]; a, p, a2 = a² [M, S]; one = 1 (0-dim,
    so that 1 + φ·P' is one addcmul)."""

    v: Tensor
    lam_v: Tensor
    k: Tensor
    q: Tensor
    a: Tensor
    p: Tensor
    a2: Tensor
    one: Tensor


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


def _chunked(v: Tensor, lambda_v: Tensor, k: Tensor, q: Tensor, a: Tensor, p: Tensor, chunk: int) -> Chunked:
    """The inputs of `kla_scan_torch` (compute dtype) cut into C-step chunks."""
    return Chunked(*(_to_chunks(t, chunk) for t in (v, lambda_v, k, q)), a, p, a * a, a.new_ones(()))


def _phi(x: Chunked, c: int) -> Tensor:
    """φ = Λ·k² at step c of every chunk, [B, NC, M, S]."""
    return x.lam_v[c][..., None] * (x.k[c] * x.k[c])[..., None, :]


def _r(x: Chunked, c: int) -> Tensor:
    """r = v·Λ·k at step c of every chunk, [B, NC, M, S]."""
    return (x.v[c] * x.lam_v[c])[..., None] * x.k[c][..., None, :]


def _filter_step(x: Chunked, c: int, cov: Tensor, mean: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Step c of every chunk from (P_{t-1}, μ_{t-1}): returns (P_t, μ_t, i_t), [B, NC, M, S] each."""
    cov_pred = torch.addcmul(x.p, x.a2, cov)  # P' = a²·P + p
    gain = torch.addcmul(x.one, _phi(x, c), cov_pred).reciprocal_()  # i = 1/(1 + φ·P')
    mean = torch.addcmul(x.a * mean, _r(x, c), cov_pred).mul_(gain)  # μ = i·(a·μ + r·P')
    return cov_pred.mul_(gain), mean, gain


# The two contractions below are a product and a sum, not a (batched) matmul: on a CPU shared with other
# processes, torch's threaded bmm of these thin shapes measured ~850x slower (12 ms vs 14 µs per call).


def _rowsum(h: Tensor, w: Tensor) -> Tensor:
    """Σ_s h·w for h [B, NC, M, S], w [B, NC, S] -> [B, NC, M]."""
    return (h * w[..., None, :]).sum(-1)


def _colsum(w: Tensor, h: Tensor) -> Tensor:
    """Σ_m w·h for w [B, NC, M], h [B, NC, M, S] -> [B, NC, S]."""
    return (w[..., None] * h).sum(-2)


def _cov_starts(x: Chunked, cov0: Tensor) -> Tensor:
    """P entering every chunk, [B, NC, M, S]: per-chunk Möbius products, then the carry across chunks."""
    chunk, batch, n_chunks = x.v.shape[:3]
    if n_chunks == 1:
        return cov0[:, None]
    a2, p = x.a2, x.p
    shape = (batch, n_chunks, *a2.shape)
    ta, tb = cov0.new_ones(shape), cov0.new_zeros(shape)  # chunk product, starts as the identity
    tc, td = cov0.new_zeros(shape), cov0.new_ones(shape)
    for c in range(chunk):  # leaf [[a², p], [φ·a², 1 + φ·p]] times the running product: its second row is
        phi = _phi(x, c)  # the old second row plus φ times the new first row
        ta, tb = torch.addcmul(p * tc, a2, ta), torch.addcmul(p * td, a2, tb)
        tc, td = torch.addcmul(tc, phi, ta), torch.addcmul(td, phi, tb)
        inv_norm = (ta + tb + tc + td).reciprocal_()
        ta, tb, tc, td = ta * inv_norm, tb * inv_norm, tc * inv_norm, td * inv_norm
    starts = [cov0]
    for n in range(n_chunks - 1):
        s = starts[-1]
        starts.append((ta[:, n] * s + tb[:, n]) / (tc[:, n] * s + td[:, n]))
    return torch.stack(starts, 1)


def _mean_starts(x: Chunked, cov_starts: Tensor, mean0: Tensor) -> Tensor:
    """μ entering every chunk, [B, NC, M, S]: per-chunk affine maps (gain product, local value), then the carry."""
    chunk, _, n_chunks = x.v.shape[:3]
    if n_chunks == 1:
        return mean0[:, None]
    cov, g_run, m_run = cov_starts, torch.ones_like(cov_starts), torch.zeros_like(cov_starts)
    for c in range(chunk):  # the step run on the local value gives m_run = a·i·m_run + r·P_t
        cov, m_run, gain = _filter_step(x, c, cov, m_run)
        g_run = gain.mul_(x.a).mul_(g_run)
    starts = [mean0]
    for n in range(n_chunks - 1):
        starts.append(g_run[:, n] * starts[-1] + m_run[:, n])
    return torch.stack(starts, 1)


def _readout(x: Chunked, c: int, cov: Tensor, mean: Tensor, prior: bool) -> tuple[Tensor, Tensor]:
    """Per-state readout mean and variance at step c: (μ_t, P_t), or (a·μ_t, a²·P_t + p) with the prior."""
    if prior:
        return x.a * mean, torch.addcmul(x.p, x.a2, cov)
    return mean, cov


def _readout_sweep(x: Chunked, cov: Tensor, mean: Tensor, prior: bool, length: int):
    """Rerun every chunk from its exact start; y, y_var [C, B, NC, M] and (P, μ) after step L."""
    chunk = x.v.shape[0]
    y, y_var = x.v.new_empty(x.v.shape), x.v.new_empty(x.v.shape)
    last_c, last_n = (length - 1) % chunk, (length - 1) // chunk
    for c in range(chunk):
        cov, mean, _ = _filter_step(x, c, cov, mean)
        out_mean, out_var = _readout(x, c, cov, mean, prior)
        y[c], y_var[c] = _rowsum(out_mean, x.q[c]), _rowsum(out_var, x.q[c] * x.q[c])
        if c == last_c:
            final = cov[:, last_n], mean[:, last_n]
    return y, y_var, final


def _refill(x: Chunked, cov_starts: Tensor, mean_starts: Tensor) -> tuple[Tensor, Tensor]:
    """P_t and μ_t at every step, [C, B, NC, M, S] each, rerun from the chunk start states."""
    cov_all = cov_starts.new_empty(x.v.shape[0], *cov_starts.shape)
    mean_all = torch.empty_like(cov_all)
    cov, mean = cov_starts, mean_starts
    for c in range(x.v.shape[0]):
        cov, mean, _ = _filter_step(x, c, cov, mean)
        cov_all[c], mean_all[c] = cov, mean
    return cov_all, mean_all


class _Step(NamedTuple):
    """Per-step backward terms, [B, NC, M, S] each (see the module docstring)."""

    h_mean: Tensor  # Hμ_t = ∂ℓ/∂μ_t, everything after step t included
    h_cov: Tensor  # HP_t = ∂ℓ/∂P_t
    gain: Tensor  # i_t = 1/(1 + φ_t·P'_t)
    innov: Tensor  # r_t − a·φ_t·μ_{t-1} = Λ_t·k_t·(v_t − a·k_t·μ_{t-1})
    cov_prev: Tensor
    mean_prev: Tensor
    cov: Tensor
    mean: Tensor


class _Adjoint(NamedTuple):
    """Everything the reverse sweeps read: chunked inputs, recomputed paths, upstream gradients."""

    x: Chunked
    cov: Tensor  # [C, B, NC, M, S]
    mean: Tensor
    cov_starts: Tensor  # [B, NC, M, S]
    mean_starts: Tensor
    gy: Tensor  # [C, B, NC, M]
    gy_var: Tensor | None  # None: y_var unused (its terms are skipped)
    g_lam: Tensor | None  # [B, M, S]: gradient of the final state, None when unused
    g_eta: Tensor | None
    prior: bool
    length: int


def _step_terms(s: _Adjoint, c: int, later_mean: Tensor, later_cov: Tensor) -> _Step:
    """Step c of every chunk in reverse: the total adjoints (Hμ_t, HP_t), i.e. what the later steps hand back
    (later_mean, later_cov) plus the readout's terms eμ_t, eP_t (and at step L the final state's), and the
    step's quantities that the reverse map and the gradients read."""
    x = s.x
    cov_prev, mean_prev = (s.cov[c - 1], s.mean[c - 1]) if c else (s.cov_starts, s.mean_starts)
    cov, mean = s.cov[c], s.mean[c]
    q, gy = x.q[c][..., None, :], s.gy[c][..., None]  # [B, NC, 1, S], [B, NC, M, 1]
    h_mean = torch.addcmul(later_mean, gy * q, x.a) if s.prior else torch.addcmul(later_mean, gy, q)
    h_cov = later_cov
    if s.gy_var is not None:
        gy_var, q2 = s.gy_var[c][..., None], q * q
        h_cov = torch.addcmul(later_cov, gy_var * q2, x.a2) if s.prior else torch.addcmul(later_cov, gy_var, q2)
    chunk = s.cov.shape[0]
    if c == (s.length - 1) % chunk and (s.g_lam is not None or s.g_eta is not None):
        n = (s.length - 1) // chunk  # (λ, η) = (1/P, μ/P): ∂ℓ/∂μ = gη·λ, ∂ℓ/∂P = −(gλ + gη·μ)·λ²
        lam = cov[:, n].reciprocal()
        seed = torch.zeros_like(lam) if s.g_lam is None else s.g_lam.clone()
        if s.g_eta is not None:
            h_mean[:, n] += s.g_eta * lam
            seed.addcmul_(s.g_eta, mean[:, n])
        h_cov = later_cov.clone() if h_cov is later_cov else h_cov
        h_cov[:, n] -= seed.mul_(lam).mul_(lam)
    phi = _phi(x, c)
    gain = torch.addcmul(x.one, phi, torch.addcmul(x.p, x.a2, cov_prev)).reciprocal_()
    innov = torch.addcmul(_r(x, c), phi, x.a * mean_prev, value=-1)
    return _Step(h_mean, h_cov, gain, innov, cov_prev, mean_prev, cov, mean)


def _adjoint_carries(s: _Adjoint) -> tuple[Tensor, Tensor]:
    """The adjoint (Hμ, HP) that the later chunks hand to every chunk's last state, [B, NC, M, S] each.

    Per chunk, the reverse steps compose into the lower-triangular affine map
    (Hμ, HP)_out = [[m11, 0], [m21, m22]]·(Hμ, HP)_in + (b1, b2); the carry chains those maps backwards.
    """
    n_chunks = s.cov.shape[2]
    zero = torch.zeros_like(s.cov_starts)
    if n_chunks == 1:
        return zero, zero
    a, a2 = s.x.a, s.x.a2
    m11, m21, m22, b1, b2 = torch.ones_like(zero), zero, torch.ones_like(zero), zero, zero
    for c in range(s.cov.shape[0] - 1, -1, -1):
        t = _step_terms(s, c, b1, b2)
        alpha, gamma = a * t.gain, a2 * t.gain * t.gain  # the step's map [[α, 0], [β, γ]]
        beta = gamma * t.innov
        m21, m11, m22 = gamma * m21 + beta * m11, alpha * m11, gamma * m22
        b1, b2 = alpha * t.h_mean, gamma * t.h_cov + beta * t.h_mean
    g_mean, g_cov = [zero[:, 0]], [zero[:, 0]]
    for n in range(n_chunks - 1, 0, -1):
        g_mean.append(m11[:, n] * g_mean[-1] + b1[:, n])
        g_cov.append(m21[:, n] * g_mean[-2] + m22[:, n] * g_cov[-1] + b2[:, n])
    return torch.stack(g_mean[::-1], 1), torch.stack(g_cov[::-1], 1)


def _gradient_sweep(s: _Adjoint, g_mean: Tensor, g_cov: Tensor) -> tuple[Tensor, ...]:
    """Exact reverse sweep from the chunk carries: gradients of v, Λ, k, q (chunked), a, p, λ_0, η_0."""
    x, a = s.x, s.x.a
    g_v, g_lam_v, g_k, g_q = (torch.empty_like(t) for t in (x.v, x.lam_v, x.k, x.q))
    acc_w, acc_c, acc_p = (torch.zeros_like(g_mean) for _ in range(3))  # Σ gw·μ_{t-1}, Σ P_{t-1}·gP', Σ gP'
    for c in range(s.cov.shape[0] - 1, -1, -1):
        t = _step_terms(s, c, g_mean, g_cov)
        h_mean, h_cov = t.h_mean, t.h_cov
        z = torch.addcmul(h_mean * t.mean, h_cov, t.cov)  # Hμ·μ_t + HP·P_t
        g_r, g_phi_neg = h_mean * t.cov, z * t.cov  # ∂ℓ/∂r_t = Hμ·P_t, ∂ℓ/∂φ_t = −z·P_t
        k = x.k[c]
        sk = _rowsum(g_r, k)
        g_v[c] = x.lam_v[c] * sk
        g_lam_v[c] = torch.addcmul(_rowsum(g_phi_neg, k * k).neg_(), x.v[c], sk)
        g_k[c] = torch.addcmul(_colsum(x.lam_v[c] * x.v[c], g_r), k, _colsum(x.lam_v[c], g_phi_neg), value=-2)
        out_mean, out_var = _readout(x, c, t.cov, t.mean, s.prior)
        g_q[c] = _colsum(s.gy[c], out_mean)
        if s.gy_var is not None:
            g_q[c].addcmul_(2 * x.q[c], _colsum(s.gy_var[c], out_var))
        g_w = h_mean * t.gain  # ∂ℓ/∂(a·μ_{t-1} + r_t·P'_t)
        g_pred = torch.addcmul(h_cov, h_mean, t.innov).mul_(t.gain).mul_(t.gain)  # ∂ℓ/∂P'_t
        acc_w.addcmul_(g_w, t.mean_prev)
        acc_c.addcmul_(g_pred, t.cov_prev)
        acc_p += g_pred
        if s.prior:  # direct readout terms of μ' = a·μ and σ'² = a²·P + p
            q = x.q[c][..., None, :]  # [B, NC, 1, S]
            acc_w.addcmul_(s.gy[c][..., None] * q, t.mean)
            if s.gy_var is not None:
                q2_gy_var = s.gy_var[c][..., None] * (q * q)
                acc_c.addcmul_(q2_gy_var, t.cov)
                acc_p += q2_gy_var
        g_mean, g_cov = a * g_w, x.a2 * g_pred
    g_a = acc_w.sum((0, 1)) + 2 * a * acc_c.sum((0, 1))
    cov0, mean0 = s.cov_starts[:, 0], s.mean_starts[:, 0]  # (λ_0, η_0) = (1/P_0, μ_0/P_0)
    g_lam0 = torch.addcmul(g_cov[:, 0] * cov0, g_mean[:, 0], mean0).mul_(cov0).neg_()
    return g_v, g_lam_v, g_k, g_q, g_a, acc_p.sum((0, 1)), g_lam0, g_mean[:, 0] * cov0


class KLAScanFunction(torch.autograd.Function):
    """Autograd wrapper: forward = chunked parallel scan, backward = the exact adjoint sweeps above.

    All tensors arrive in one compute dtype (float32 or float64); shapes as in `kla_scan_torch`. The state
    crosses the interface as (λ, η) and runs inside as (P, μ) = (1/λ, η/λ).
    """

    @staticmethod
    def forward(ctx, v, lambda_v, k, q, a, p, lam0, eta0, decode_from_prior: bool, chunk: int):
        length = v.shape[1]
        x = _chunked(v, lambda_v, k, q, a, p, chunk)
        cov0 = lam0.reciprocal()
        cov_starts = _cov_starts(x, cov0)
        mean_starts = _mean_starts(x, cov_starts, eta0 * cov0)
        y, y_var, (cov, mean) = _readout_sweep(x, cov_starts, mean_starts, decode_from_prior, length)
        ctx.save_for_backward(v, lambda_v, k, q, a, p, cov_starts, mean_starts)
        ctx.prior, ctx.chunk = decode_from_prior, chunk
        ctx.set_materialize_grads(False)  # outputs the loss does not use (y_var in training) arrive as None
        lam = cov.reciprocal()  # inf where P underflowed: λ beyond the dtype's range
        return _from_chunks(y, length), _from_chunks(y_var, length), lam, mean * lam

    @staticmethod
    @once_differentiable
    def backward(ctx, gy, gy_var, g_lam, g_eta):
        v, lambda_v, k, q, a, p, cov_starts, mean_starts = ctx.saved_tensors
        length = v.shape[1]
        x = _chunked(v, lambda_v, k, q, a, p, ctx.chunk)
        cov, mean = _refill(x, cov_starts, mean_starts)
        gy = torch.zeros_like(v) if gy is None else gy
        gyc, gvc = _to_chunks(gy, ctx.chunk), None if gy_var is None else _to_chunks(gy_var, ctx.chunk)
        s = _Adjoint(x, cov, mean, cov_starts, mean_starts, gyc, gvc, g_lam, g_eta, ctx.prior, length)
        g_mean, g_cov = _adjoint_carries(s)
        g_v, g_lam_v, g_k, g_q, g_a, g_p, g_lam0, g_eta0 = _gradient_sweep(s, g_mean, g_cov)
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
