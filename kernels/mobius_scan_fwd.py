"""Forward Triton kernel of the KLA scan (oracle: `klalm.ops.reference.kla_scan_reference`).

The filter of shared/DESIGN.md §1 runs here in covariance form, which is the same map as the
information form (λ = 1/P, η = μ/P) but needs one reciprocal per (b, t, m, s) instead of two:

    P'_t = a²·P_{t-1} + p                    (predicted variance; 1/P'_t = λ_{t-1}/d_t)
    i_t  = 1 / (1 + φ_t·P'_t)                (the Möbius step, normalised so its denominator is 1)
    P_t  = P'_t·i_t                          (= 1/λ_t)
    μ_t  = i_t·(a·μ_{t-1} + r_t·P'_t)        (= η_t/λ_t)
    y_t  = Σ_s q_t·μ_t        y_var_t = Σ_s q_t²·P_t

One program owns one batch row and BM channels; its [S_PAD, BM] state lives in registers (the layout
is Triton's; kernels/NOTES.md records what it chose) and walks time in order. Loads of step t+1.. are
prefetched into shared memory by Triton's software pipeliner (`num_stages`). Every CHUNK steps the
program saves its state, which is all the backward needs to recompute the states of one chunk at a
time (see mobius_scan_bwd.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from klalm.kernels.common import ScanConfig, interpreting, rcp


@triton.jit
def _filter_step(b_P, b_mu, b_a, b_a2, b_p, b_phi, b_r, FAST_RCP: tl.constexpr):
    """One predict+update step in covariance form; returns (P_t, μ_t, P'_t, i_t), each [S_PAD, BM]."""
    b_Pp = b_a2 * b_P + b_p
    b_i = rcp(1.0 + b_phi * b_Pp, FAST_RCP)
    return b_Pp * b_i, b_i * (b_a * b_mu + b_r * b_Pp), b_Pp, b_i


@triton.jit
def _load_step(p_v, p_lv, p_k, p_q, m_m, m_s):
    """Load one step's v, Λ [BM] and k, q [S_PAD] as float32 from pointer blocks (padding reads 0)."""
    b_v = tl.load(p_v, mask=m_m, other=0.0).to(tl.float32)
    b_lv = tl.load(p_lv, mask=m_m, other=0.0).to(tl.float32)
    b_k = tl.load(p_k, mask=m_s, other=0.0).to(tl.float32)
    b_q = tl.load(p_q, mask=m_s, other=0.0).to(tl.float32)
    return b_v, b_lv, b_k, b_q


@triton.jit
def _kla_fwd_kernel(
    v_ptr, lam_v_ptr, k_ptr, q_ptr, a_ptr, p_ptr, lam0_ptr, eta0_ptr,
    y_ptr, y_var_ptr, lam_out_ptr, eta_out_ptr, ckpt_P_ptr, ckpt_mu_ptr,
    L, M, S, n_chunks,
    BM: tl.constexpr, S_PAD: tl.constexpr, CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr, UNROLL: tl.constexpr,
    HAS_INIT: tl.constexpr, PRIOR: tl.constexpr, SAVE_CKPT: tl.constexpr, FAST_RCP: tl.constexpr,
):  # fmt: skip
    i_b = tl.program_id(0).to(tl.int64)
    o_m = tl.program_id(1) * BM + tl.arange(0, BM)  # [BM]
    o_s = tl.arange(0, S_PAD)  # [S_PAD]
    m_m, m_s = o_m < M, o_s < S
    m_sm = m_s[:, None] & m_m[None, :]  # [S_PAD, BM]
    o_ms = o_m[None, :] * S + o_s[:, None]  # [S_PAD, BM] into [M, S] (read and written once per program)
    b_a = tl.load(a_ptr + o_ms, mask=m_sm, other=1.0).to(tl.float32)
    b_p = tl.load(p_ptr + o_ms, mask=m_sm, other=0.0).to(tl.float32)
    b_a2 = b_a * b_a
    if HAS_INIT:
        b_lam0 = tl.load(lam0_ptr + i_b * M * S + o_ms, mask=m_sm, other=1.0).to(tl.float32)
        b_eta0 = tl.load(eta0_ptr + i_b * M * S + o_ms, mask=m_sm, other=0.0).to(tl.float32)
        b_P = 1.0 / b_lam0
        b_mu = b_eta0 * b_P
    else:
        b_P = tl.full([S_PAD, BM], 1.0, tl.float32)
        b_mu = tl.zeros([S_PAD, BM], tl.float32)
    o_ckpt = (i_b * n_chunks * S + o_s[:, None]) * M + o_m[None, :]  # [S_PAD, BM] into [B, NC, S, M]
    o_bm, o_bs = i_b * L * M + o_m, i_b * L * S + o_s  # [BM], [S_PAD] at t = 0
    for i_c in range(n_chunks):
        if SAVE_CKPT:
            o_c = o_ckpt + i_c * S * M
            tl.store(ckpt_P_ptr + o_c, b_P, mask=m_sm)
            tl.store(ckpt_mu_ptr + o_c, b_mu, mask=m_sm)
        t1 = (i_c + 1) * CHUNK
        if t1 > L:
            t1 = L
        for t in tl.range(i_c * CHUNK, t1, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):
            o_tm, o_ts = o_bm + t * M, o_bs + t * S
            b_v, b_lv, b_k, b_q = _load_step(v_ptr + o_tm, lam_v_ptr + o_tm, k_ptr + o_ts, q_ptr + o_ts, m_m, m_s)
            b_phi = b_lv[None, :] * (b_k * b_k)[:, None]  # [S_PAD, BM]
            b_r = (b_v * b_lv)[None, :] * b_k[:, None]  # [S_PAD, BM]
            b_P, b_mu, _, _ = _filter_step(b_P, b_mu, b_a, b_a2, b_p, b_phi, b_r, FAST_RCP)
            if PRIOR:
                b_mean, b_var = b_a * b_mu, b_a2 * b_P + b_p
            else:
                b_mean, b_var = b_mu, b_P
            b_y = tl.sum(b_q[:, None] * b_mean, axis=0)  # [BM]
            b_yv = tl.sum((b_q * b_q)[:, None] * b_var, axis=0)  # [BM]
            tl.store(y_ptr + o_tm, b_y.to(y_ptr.dtype.element_ty), mask=m_m)
            tl.store(y_var_ptr + o_tm, b_yv.to(y_var_ptr.dtype.element_ty), mask=m_m)
    b_lam = 1.0 / b_P
    tl.store(lam_out_ptr + i_b * M * S + o_ms, b_lam, mask=m_sm)
    tl.store(eta_out_ptr + i_b * M * S + o_ms, b_mu * b_lam, mask=m_sm)


def mobius_scan_fwd(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    lam0: Tensor | None,
    eta0: Tensor | None,
    decode_from_prior: bool,
    config: ScanConfig,
    save_ckpt: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """Launch the forward kernel on contiguous inputs (checked by the caller).

    Shapes: v, lambda_v [B, L, M]; k, q [B, L, S]; a, p [M, S]; lam0, eta0 [B, M, S] or None (fresh).
    The kernel reads and writes state-shaped tensors once per program in their own [.., M, S] layout; only the
    chunk states, touched every chunk, are stored channel-contiguous.
    Returns y, y_var [B, L, M] in v's dtype; final λ, η [B, M, S] float32; and, when `save_ckpt`, the
    states (P, μ) before every chunk, each [B, NC, S, M] float32 with NC = ceil(L / chunk), else None.
    """
    batch, length, channels = v.shape
    state_size = k.shape[-1]
    n_chunks = triton.cdiv(length, config.chunk)
    y, y_var = torch.empty_like(v), torch.empty_like(v)
    lam = v.new_empty(batch, channels, state_size, dtype=torch.float32)
    eta = torch.empty_like(lam)
    ckpt_P = ckpt_mu = None
    if save_ckpt:
        ckpt_P = v.new_empty(batch, n_chunks, state_size, channels, dtype=torch.float32)
        ckpt_mu = torch.empty_like(ckpt_P)
    grid = (batch, triton.cdiv(channels, config.block_m))
    _kla_fwd_kernel[grid](
        v, lambda_v, k, q, a, p, lam0, eta0, y, y_var, lam, eta, ckpt_P, ckpt_mu,
        length, channels, state_size, n_chunks,
        BM=config.block_m, S_PAD=triton.next_power_of_2(state_size), CHUNK=config.chunk,
        NUM_STAGES=config.num_stages, UNROLL=config.unroll,
        HAS_INIT=lam0 is not None, PRIOR=decode_from_prior, SAVE_CKPT=save_ckpt,
        FAST_RCP=not interpreting(),
        num_warps=config.num_warps,
    )  # fmt: skip
    return y, y_var, lam, eta, ckpt_P, ckpt_mu
