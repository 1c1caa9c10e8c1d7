"""Backward Triton kernels of the KLA scan: exact gradients with no [B, L, M, S] tensor in HBM.

Oracle: autograd through `klalm.ops.reference.kla_scan_reference`. The forward (mobius_scan_fwd.py)
saved the covariance-form state (P, μ) before every chunk of CHUNK steps. Each program walks the
chunks backwards; for one chunk it recomputes the states from the saved one into a small per-program
scratch buffer ([CHUNK, S_PAD, BM]; stored and loaded with L2 priority `evict_last`, the gradient rows with
`evict_first`: 2 % faster on an H200, kernels/NOTES.md), then runs the reverse adjoint recursion of

    P'_t = a²·P_{t-1} + p     i_t = 1/(1 + φ_t·P'_t)     P_t = P'_t·i_t
    w_t = a·μ_{t-1} + r_t·P'_t                           μ_t = i_t·w_t

with gμ_t, gP_t the adjoints of the state after step t (readout terms added first):

    gw = gμ·i      gN = −gi·i² = −(gμ·μ_t + gP·P_t)·i       gP' = gP·i + gw·r + gN·φ
    gφ = gN·P'     gr = gw·P'             gμ_{t-1} = a·gw  gP_{t-1} = a²·gP'
    ga += gw·μ_{t-1} + 2a·P_{t-1}·gP'     gp += gP'

(gi = gμ·w + gP·P' is the adjoint of i; since μ_t = i·w and P_t = i·P', −gi·i² = −(gμ·μ_t + gP·P_t)·i.)
The two terms of ga are summed in separate registers (ga, ga2) and combined as ga + 2a·ga2 at the end.

and φ = Λ·k², r = v·Λ·k. Reductions over s (dv, dΛ) stay in each thread; reductions over m (dk, dq)
give one [S] row per (program, t), written to a [B, M/BM, L, S] buffer that the caller sums; da, dp
are summed over t in registers and over b by the caller. No atomics: results are deterministic.

Time-parallel split (the forward's, mobius_scan_fwd.py). The adjoint of the state after step t obeys, with
e_t = (∂ℓ/∂μ_t, ∂ℓ/∂P_t) through the readout at t alone (y: q·∂y, ·a with the prior; y_var: q²·∂y_var, ·a²),

    G_{t-1} = e_{t-1} + A_t·G_t        A_t = [[a·i_t, 0], [a²·i_t·(r_t − φ_t·μ_t), a²·i_t²]]     on (gμ, gP)

(A_t is the map gμ, gP → gμ_{t-1}, gP_{t-1} above written out, with 1 − φ·P_t = i_t). So what a segment of
steps s0+1..s1 passes back to the state before it is affine in what reaches its last state from later ones:

    H = Q_{s1}·H_next + Σ_{t=s0+1..s1} Q_t·e_t          Q_t = A_{s0+1}···A_t   (lower triangular)

`_kla_bwd_summary_kernel` walks each segment but the first forwards from its saved start state and accumulates
Q (3 numbers) and the sum (2 numbers): no reverse walk, no scratch, and every factor has |entries| ≤ 1 on the
diagonal (a ≤ 1, i ≤ 1), so nothing overflows. `_kla_bwd_carry_kernel` then walks the segments backwards from
the final-state gradient and writes, for every segment, the adjoint arriving at its last state; with it as the
starting (gμ, gP), `_kla_bwd_kernel` runs all segments at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from klalm.kernels.common import (
    SUMMARY_UNROLL,
    ScanConfig,
    as_rows,
    interpreting,
    load_row,
    pair_unroll,
    rcp,
    row_start,
    segment_chunks,
    state_pad,
    store_reduced_row,
    to_kernel_layout,
)
from klalm.kernels.mobius_scan_fwd import _filter_step, _precision, _precision_once, _precision_slope

CARRY_SIZE = tl.constexpr(2)  # adjoint (gμ, gP) arriving at a segment's last state
ADJOINT_SUMMARY_SIZE = tl.constexpr(5)  # Q11, Q21, Q22 and the summed injections Σ Q_t·e_t of a segment's reverse map


@triton.jit
def _final_state_adjoint(lam_ptr, eta_ptr, glam_ptr, geta_ptr, o, mask):
    """(gμ, gP) of the final state from the gradients of the returned (λ, η) = (1/P, μ/P), [S_PAD, BM] each."""
    b_lam = tl.load(lam_ptr + o, mask=mask, other=1.0)
    b_eta = tl.load(eta_ptr + o, mask=mask, other=0.0)
    b_glam = tl.load(glam_ptr + o, mask=mask, other=0.0).to(tl.float32)
    b_geta = tl.load(geta_ptr + o, mask=mask, other=0.0).to(tl.float32)
    return b_geta * b_lam, -(b_glam * b_lam + b_geta * b_eta) * b_lam


@triton.jit
def _mean_readout_adjoint(b_gmu, b_ga, b_mu, b_a, b_q, b_gy, PRIOR: tl.constexpr):
    """Gradients of y = Σ_s q·m (m = μ, or a·μ from the prior): returns (gμ, ga, the dq terms [S_PAD, BM])."""
    if PRIOR:
        b_gmu += (b_a * b_q[:, None]) * b_gy[None, :]
        b_ga += b_q[:, None] * b_gy[None, :] * b_mu
        b_dq = b_gy[None, :] * b_a * b_mu
    else:
        b_gmu += b_q[:, None] * b_gy[None, :]
        b_dq = b_gy[None, :] * b_mu
    return b_gmu, b_ga, b_dq


@triton.jit
def _var_readout_adjoint(b_gP, b_ga2, b_gp, b_dq, b_P, b_a2, b_p, b_q, b_gyv, PRIOR: tl.constexpr):
    """Gradients of y_var = Σ_s q²·c (c = P, or a²·P + p from the prior): returns (gP, ga2, gp, dq terms)."""
    b_q2 = (b_q * b_q)[:, None]  # [S_PAD, 1]
    if PRIOR:
        b_gP += (b_a2 * b_q2) * b_gyv[None, :]
        b_ga2 += b_q2 * b_gyv[None, :] * b_P
        b_gp += b_q2 * b_gyv[None, :]
        b_dq += 2.0 * b_q[:, None] * b_gyv[None, :] * (b_a2 * b_P + b_p)
    else:
        b_gP += b_q2 * b_gyv[None, :]
        b_dq += 2.0 * b_q[:, None] * b_gyv[None, :] * b_P
    return b_gP, b_ga2, b_gp, b_dq


@triton.jit
def _precision_and_slope_once(b_x, floor):
    """(Λ, dΛ/dx) of a row b_x [BM] of log σ², each element computed in one lane (see the forward's
    `_precision_once`); bitwise `_precision(b_x, floor)` and `_precision_slope(b_x, Λ)`. The two are joined into one
    [BM, 2] tensor before the anchoring reduction, so they cross into the state's layout in one exchange (two
    separate ones: one more shared-memory store and barrier per step, and more modelled cycles, 1,390 against 1,356
    per step, fp32 sm_90)."""
    c_x = b_x[:, None]  # [BM, 1]
    c_lv = _precision(c_x, floor)
    return tl.split(tl.max(tl.join(c_lv, _precision_slope(c_x, c_lv)), axis=1))  # [BM, 2] -> 2 x [BM]


@triton.jit
def _step_rows(p_v, p_lv, p_k, t, m0, m_end, s_end, M, S, BM: tl.constexpr, S_PAD: tl.constexpr,
               V_FMT: tl.constexpr, LV_FMT: tl.constexpr, K_FMT: tl.constexpr):  # fmt: skip
    """Step t's v and Λ (or log σ²) rows [BM] and k row [S_PAD], float32."""
    b_v = load_row(row_start(p_v, t, M, V_FMT), m0, m_end, BM, V_FMT)
    b_x = load_row(row_start(p_lv, t, M, LV_FMT), m0, m_end, BM, LV_FMT)
    b_k = load_row(row_start(p_k, t, S, K_FMT), 0, s_end, S_PAD, K_FMT)
    return b_v, b_x, b_k


@triton.jit
def _phi_r(b_v, b_x, b_k, floor, LOGVAR: tl.constexpr):
    """φ_t = Λ·k² and r_t = v·Λ·k from step t's rows, [S_PAD, BM] each: what the filter step needs besides the state."""
    b_lv = b_x
    if LOGVAR:
        b_lv = _precision_once(b_x, floor)
    return b_lv[None, :] * (b_k * b_k)[:, None], (b_v * b_lv)[None, :] * b_k[:, None]


@triton.jit
def _step_inputs(p_v, p_lv, p_k, t, m0, m_end, s_end, M, S, floor, BM: tl.constexpr, S_PAD: tl.constexpr,
                 LOGVAR: tl.constexpr, V_FMT: tl.constexpr, LV_FMT: tl.constexpr, K_FMT: tl.constexpr):  # fmt: skip
    """φ_t and r_t of step t read from its rows (`_step_rows`, `_phi_r`)."""
    b_v, b_x, b_k = _step_rows(p_v, p_lv, p_k, t, m0, m_end, s_end, M, S, BM, S_PAD, V_FMT, LV_FMT, K_FMT)
    return _phi_r(b_v, b_x, b_k, floor, LOGVAR)


@triton.jit
def _reverse_step(
    t, b_v, b_x, b_k, b_Pm, b_mum, b_P, b_mu, b_gmu, b_gP, b_ga, b_ga2, b_gp, b_a, b_a2, b_p,
    p_q, p_gy, p_gyv, p_dv, p_dlv, p_dk, p_dq, o_m, o_s, m_m, m_s, m0, m_end, s_end, M, S, floor,
    BM: tl.constexpr, S_PAD: tl.constexpr, PRIOR: tl.constexpr, HAS_GYV: tl.constexpr, FAST_RCP: tl.constexpr,
    LOGVAR: tl.constexpr, Q_FMT: tl.constexpr, GY_FMT: tl.constexpr, GYV_FMT: tl.constexpr,
):  # fmt: skip
    """The adjoint recursion (module doc) through step t, from its rows v, Λ (or log σ²), k (`_step_rows`) and the
    states before (b_Pm, b_mum) and after (b_P, b_mu) it: stores the step's dv, dΛ rows and dk, dq partial rows;
    returns (gμ, gP) of the state before the step and the running sums ga, ga2, gp."""
    b_q = load_row(row_start(p_q, t, S, Q_FMT), 0, s_end, S_PAD, Q_FMT)
    b_lv = b_x
    b_slope = b_x  # dΛ/d log σ² (LOGVAR only)
    if LOGVAR:
        b_lv, b_slope = _precision_and_slope_once(b_x, floor)
    b_gy = load_row(row_start(p_gy, t, M, GY_FMT), m0, m_end, BM, GY_FMT)
    b_phi = b_lv[None, :] * (b_k * b_k)[:, None]  # [S_PAD, BM]
    b_r = (b_v * b_lv)[None, :] * b_k[:, None]  # [S_PAD, BM]
    b_Pp = b_a2 * b_Pm + b_p  # as _filter_step forms P'_t and i_t
    b_i = rcp(1.0 + b_phi * b_Pp, FAST_RCP)
    b_gmu, b_ga, b_dq = _mean_readout_adjoint(b_gmu, b_ga, b_mu, b_a, b_q, b_gy, PRIOR)
    if HAS_GYV:  # y_var was used
        b_gyv = load_row(row_start(p_gyv, t, M, GYV_FMT), m0, m_end, BM, GYV_FMT)
        b_gP, b_ga2, b_gp, b_dq = _var_readout_adjoint(b_gP, b_ga2, b_gp, b_dq, b_P, b_a2, b_p, b_q, b_gyv, PRIOR)
    b_gw = b_gmu * b_i
    b_gN = -(b_gmu * b_mu + b_gP * b_P) * b_i
    b_gPp = b_gP * b_i + b_gw * b_r + b_gN * b_phi
    b_gphi = b_gN * b_Pp
    b_gr = b_gw * b_Pp
    b_ga += b_gw * b_mum
    b_ga2 += b_Pm * b_gPp
    b_gp += b_gPp
    b_kgr = b_k[:, None] * b_gr  # [S_PAD, BM]
    b_dv = b_lv * tl.sum(b_kgr, axis=0)  # [BM]
    b_dlv = tl.sum(b_k[:, None] * b_k[:, None] * b_gphi + b_v[None, :] * b_kgr, axis=0)
    if LOGVAR:  # d/d log σ²
        b_dlv = b_dlv * b_slope
    b_dk = tl.sum(b_lv[None, :] * (2.0 * b_k[:, None] * b_gphi + b_v[None, :] * b_gr), axis=1)  # [S_PAD]
    # written once and read only by torch after the kernel: evict first, so the scratch keeps its L2 lines
    b_dv, b_dlv = b_dv.to(p_dv.dtype.element_ty), b_dlv.to(p_dlv.dtype.element_ty)
    store_reduced_row(p_dv + t * M, b_dv, o_m, o_s, m_m, S_PAD, BM, True)
    store_reduced_row(p_dlv + t * M, b_dlv, o_m, o_s, m_m, S_PAD, BM, True)
    tl.store(p_dk + t * S + o_s, b_dk, mask=m_s, eviction_policy="evict_first")
    tl.store(p_dq + t * S + o_s, tl.sum(b_dq, axis=1), mask=m_s, eviction_policy="evict_first")
    return b_a * b_gw, b_a2 * b_gPp, b_ga, b_ga2, b_gp


@triton.jit
def _kla_bwd_kernel(
    v_ptr, lam_v_ptr, k_ptr, q_ptr, a_ptr, p_ptr, lam0_ptr, eta0_ptr,
    ckpt_P_ptr, ckpt_mu_ptr, lam_out_ptr, eta_out_ptr, gy_ptr, gyv_ptr, glam_ptr, geta_ptr,
    carry_ptr, dv_ptr, dlv_ptr, dk_ptr, dq_ptr, da_ptr, dp_ptr, dlam0_ptr, deta0_ptr, scr_P_ptr, scr_mu_ptr,
    L, M, S, n_chunks, seg_chunks, floor,
    BM: tl.constexpr, S_PAD: tl.constexpr, CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr,
    PAIR_UNROLL: tl.constexpr, HAS_INIT: tl.constexpr, PRIOR: tl.constexpr, HAS_GYV: tl.constexpr,
    HAS_GSTATE: tl.constexpr,
    HAS_CARRY: tl.constexpr, FAST_RCP: tl.constexpr, LOGVAR: tl.constexpr, EVEN_S: tl.constexpr,
    EVEN_M: tl.constexpr,
    V_FMT: tl.constexpr, LV_FMT: tl.constexpr, K_FMT: tl.constexpr, Q_FMT: tl.constexpr, GY_FMT: tl.constexpr,
    GYV_FMT: tl.constexpr,
):  # fmt: skip
    i_b, i_mb, i_seg = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    n_mb, n_seg = tl.num_programs(1), tl.num_programs(2)
    m0 = i_mb * BM
    o_m = m0 + tl.arange(0, BM)  # [BM]
    o_s = tl.arange(0, S_PAD)  # [S_PAD]
    m_m, m_s = o_m < M, o_s < S
    m_sm = m_s[:, None] & m_m[None, :]  # [S_PAD, BM]
    o_sm = o_s[:, None] * M + o_m[None, :]  # [S_PAD, BM] into [S, M]: a, p come transposed (channel-contiguous)
    o_bms = i_b * M * S + o_m[None, :] * S + o_s[:, None]  # [S_PAD, BM] into [B, M, S] (touched once per program)
    b_a = tl.load(a_ptr + o_sm, mask=m_sm, other=1.0).to(tl.float32)
    b_p = tl.load(p_ptr + o_sm, mask=m_sm, other=0.0).to(tl.float32)
    b_a2 = b_a * b_a
    if HAS_CARRY:  # time segments: what the later segments (and the final state) pass back to this one's end
        p_carry = carry_ptr + (i_b * n_seg + i_seg) * CARRY_SIZE * S * M + o_sm
        b_gmu = tl.load(p_carry, mask=m_sm, other=0.0)
        b_gP = tl.load(p_carry + S * M, mask=m_sm, other=0.0)
    elif HAS_GSTATE:
        b_gmu, b_gP = _final_state_adjoint(lam_out_ptr, eta_out_ptr, glam_ptr, geta_ptr, o_bms, m_sm)
    else:
        b_gmu = tl.zeros([S_PAD, BM], tl.float32)
        b_gP = tl.zeros([S_PAD, BM], tl.float32)
    b_ga = tl.zeros([S_PAD, BM], tl.float32)  # Σ gw·μ_{t-1} (+ prior readout terms)
    b_ga2 = tl.zeros([S_PAD, BM], tl.float32)  # Σ P_{t-1}·gP' (+ prior readout terms); da = ga + 2a·ga2
    b_gp = tl.zeros([S_PAD, BM], tl.float32)
    o_ckpt = (i_b * n_chunks * S + o_s[:, None]) * M + o_m[None, :]  # [S_PAD, BM] into [B, NC, S, M]
    i_prog = (i_b * n_mb + i_mb) * n_seg + i_seg
    # the per-step loads and stores index from this program's rows with int32 offsets (t·M, t·S, the scratch slot)
    # and masks that do not change with t: no 64-bit address arithmetic and no compares in the time loops
    p_scr_P = scr_P_ptr + i_prog * ((CHUNK + 1) // 2) * S_PAD * BM
    p_scr_mu = scr_mu_ptr + i_prog * ((CHUNK + 1) // 2) * S_PAD * BM
    o_scr = o_s[:, None] * BM + tl.arange(0, BM)[None, :]  # [S_PAD, BM] into one [S_PAD, BM] slot
    p_v, p_lv = row_start(v_ptr, i_b * L, M, V_FMT), row_start(lam_v_ptr, i_b * L, M, LV_FMT)
    p_k, p_q = row_start(k_ptr, i_b * L, S, K_FMT), row_start(q_ptr, i_b * L, S, Q_FMT)
    p_gy, p_gyv = row_start(gy_ptr, i_b * L, M, GY_FMT), gyv_ptr
    if HAS_GYV:  # else gyv_ptr is None
        p_gyv = row_start(gyv_ptr, i_b * L, M, GYV_FMT)
    p_dv, p_dlv = dv_ptr + i_b * L * M, dlv_ptr + i_b * L * M
    p_dk = dk_ptr + (i_b * n_mb + i_mb) * L * S  # [B, NMB, L, S] at t = 0
    p_dq = dq_ptr + (i_b * n_mb + i_mb) * L * S
    # the per-step rows' bounds; None where the rows are whole (S == S_PAD: k, q; M % BM == 0: v, Λ, gy), which
    # reads them without a per-lane mask: with one, ptxas made each 4-byte copy of k, q a branch with 13-cycle
    # predicate stalls, and every masked copy needs predicate arithmetic (sm_90 code, kernels/NOTES.md)
    s_end, m_end = S, M
    if EVEN_S:
        s_end = None
    if EVEN_M:
        m_end = None
    c1 = (i_seg + 1) * seg_chunks
    if c1 > n_chunks:
        c1 = n_chunks
    for i_c in range(c1 - i_seg * seg_chunks):  # the segment's chunks, last first
        t0 = (c1 - 1 - i_c) * CHUNK
        t1 = t0 + CHUNK
        if t1 > L:
            t1 = L
        n_pairs = (t1 - t0) // 2
        b_P = tl.load(ckpt_P_ptr + o_ckpt + (t0 // CHUNK) * S * M, mask=m_sm, other=1.0)
        b_mu = tl.load(ckpt_mu_ptr + o_ckpt + (t0 // CHUNK) * S * M, mask=m_sm, other=0.0)
        # recompute the chunk's states, keeping the state before every even step t0 + 2j in scratch slot j
        for j in tl.range(0, n_pairs, num_stages=NUM_STAGES, loop_unroll_factor=PAIR_UNROLL):
            tl.store(p_scr_P + j * S_PAD * BM + o_scr, b_P, eviction_policy="evict_last")
            tl.store(p_scr_mu + j * S_PAD * BM + o_scr, b_mu, eviction_policy="evict_last")
            for t in tl.static_range(2):
                b_phi, b_r = _step_inputs(p_v, p_lv, p_k, t0 + 2 * j + t, m0, m_end, s_end, M, S, floor, BM, S_PAD,
                                          LOGVAR, V_FMT, LV_FMT, K_FMT)  # fmt: skip
                b_P, b_mu, _, _ = _filter_step(b_P, b_mu, b_a, b_a2, b_p, b_phi, b_r, FAST_RCP)
        if (t1 - t0) % 2 == 1:  # a chunk of odd length (the sequence's last): its last step
            tl.store(p_scr_P + n_pairs * S_PAD * BM + o_scr, b_P, eviction_policy="evict_last")
            tl.store(p_scr_mu + n_pairs * S_PAD * BM + o_scr, b_mu, eviction_policy="evict_last")
            b_phi, b_r = _step_inputs(p_v, p_lv, p_k, t1 - 1, m0, m_end, s_end, M, S, floor, BM, S_PAD, LOGVAR,
                                      V_FMT, LV_FMT, K_FMT)  # fmt: skip
            b_P, b_mu, _, _ = _filter_step(b_P, b_mu, b_a, b_a2, b_p, b_phi, b_r, FAST_RCP)
        tl.debug_barrier()
        # b_P, b_mu now hold the state after the chunk's last step; walking back, the state after step t is the
        # one before step t + 1, and the state before an odd step is recomputed from the even one in scratch (the
        # value the forward recomputation gave: the same operations); of each step only P'_t and i_t are recomputed
        if (t1 - t0) % 2 == 1:
            b_Pm = tl.load(p_scr_P + n_pairs * S_PAD * BM + o_scr, eviction_policy="evict_last")
            b_mum = tl.load(p_scr_mu + n_pairs * S_PAD * BM + o_scr, eviction_policy="evict_last")
            b_v, b_x, b_k = _step_rows(p_v, p_lv, p_k, t1 - 1, m0, m_end, s_end, M, S, BM, S_PAD, V_FMT, LV_FMT,
                                       K_FMT)  # fmt: skip
            b_gmu, b_gP, b_ga, b_ga2, b_gp = _reverse_step(
                t1 - 1, b_v, b_x, b_k, b_Pm, b_mum, b_P, b_mu, b_gmu, b_gP, b_ga, b_ga2, b_gp, b_a, b_a2, b_p,
                p_q, p_gy, p_gyv, p_dv, p_dlv, p_dk, p_dq, o_m, o_s, m_m, m_s, m0, m_end, s_end,
                M, S, floor, BM, S_PAD, PRIOR, HAS_GYV, FAST_RCP, LOGVAR, Q_FMT, GY_FMT, GYV_FMT,
            )  # fmt: skip
            b_P, b_mu = b_Pm, b_mum
        for j in tl.range(0, n_pairs, num_stages=NUM_STAGES, loop_unroll_factor=PAIR_UNROLL):  # pairs, last first
            i_pair = n_pairs - 1 - j
            t = t0 + 2 * i_pair  # the pair's even step
            b_Pe = tl.load(p_scr_P + i_pair * S_PAD * BM + o_scr, eviction_policy="evict_last")
            b_mue = tl.load(p_scr_mu + i_pair * S_PAD * BM + o_scr, eviction_policy="evict_last")
            # step t's rows are read once: for the state after it, then for its own reverse step
            b_v, b_x, b_k = _step_rows(p_v, p_lv, p_k, t, m0, m_end, s_end, M, S, BM, S_PAD, V_FMT, LV_FMT, K_FMT)
            b_phi, b_r = _phi_r(b_v, b_x, b_k, floor, LOGVAR)
            b_Po, b_muo, _, _ = _filter_step(b_Pe, b_mue, b_a, b_a2, b_p, b_phi, b_r, FAST_RCP)  # before step t + 1
            b_v1, b_x1, b_k1 = _step_rows(p_v, p_lv, p_k, t + 1, m0, m_end, s_end, M, S, BM, S_PAD, V_FMT, LV_FMT,
                                          K_FMT)  # fmt: skip
            b_gmu, b_gP, b_ga, b_ga2, b_gp = _reverse_step(
                t + 1, b_v1, b_x1, b_k1, b_Po, b_muo, b_P, b_mu, b_gmu, b_gP, b_ga, b_ga2, b_gp, b_a, b_a2, b_p,
                p_q, p_gy, p_gyv, p_dv, p_dlv, p_dk, p_dq, o_m, o_s, m_m, m_s, m0, m_end, s_end,
                M, S, floor, BM, S_PAD, PRIOR, HAS_GYV, FAST_RCP, LOGVAR, Q_FMT, GY_FMT, GYV_FMT,
            )  # fmt: skip
            b_gmu, b_gP, b_ga, b_ga2, b_gp = _reverse_step(
                t, b_v, b_x, b_k, b_Pe, b_mue, b_Po, b_muo, b_gmu, b_gP, b_ga, b_ga2, b_gp, b_a, b_a2, b_p,
                p_q, p_gy, p_gyv, p_dv, p_dlv, p_dk, p_dq, o_m, o_s, m_m, m_s, m0, m_end, s_end,
                M, S, floor, BM, S_PAD, PRIOR, HAS_GYV, FAST_RCP, LOGVAR, Q_FMT, GY_FMT, GYV_FMT,
            )  # fmt: skip
            b_P, b_mu = b_Pe, b_mue  # the state after step t - 1
        tl.debug_barrier()
    o_part_ms = (i_b * n_seg + i_seg) * M * S + o_m[None, :] * S + o_s[:, None]  # [S_PAD, BM] into [B, n_seg, M, S]
    tl.store(da_ptr + o_part_ms, b_ga + 2.0 * b_a * b_ga2, mask=m_sm)
    tl.store(dp_ptr + o_part_ms, b_gp, mask=m_sm)
    if HAS_INIT and i_seg == 0:
        b_P0 = 1.0 / tl.load(lam0_ptr + o_bms, mask=m_sm, other=1.0).to(tl.float32)
        b_mu0 = tl.load(eta0_ptr + o_bms, mask=m_sm, other=0.0).to(tl.float32) * b_P0
        tl.store(dlam0_ptr + o_bms, -b_P0 * (b_gP * b_P0 + b_gmu * b_mu0), mask=m_sm)
        tl.store(deta0_ptr + o_bms, b_gmu * b_P0, mask=m_sm)


@triton.jit
def _kla_bwd_summary_kernel(
    v_ptr, lam_v_ptr, k_ptr, q_ptr, a_ptr, p_ptr, ckpt_P_ptr, ckpt_mu_ptr, gy_ptr, gyv_ptr, sum_ptr,
    L, M, S, n_chunks, seg_chunks, floor,
    BM: tl.constexpr, S_PAD: tl.constexpr, CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr, UNROLL: tl.constexpr,
    PRIOR: tl.constexpr, HAS_GYV: tl.constexpr, FAST_RCP: tl.constexpr, LOGVAR: tl.constexpr,
    EVEN_S: tl.constexpr, EVEN_M: tl.constexpr,
    V_FMT: tl.constexpr, LV_FMT: tl.constexpr, K_FMT: tl.constexpr, Q_FMT: tl.constexpr, GY_FMT: tl.constexpr,
    GYV_FMT: tl.constexpr,
):  # fmt: skip
    """The reverse map of segment i_seg (every segment but the first): Q and Σ Q_t·e_t (module docstring). Its rows
    are read as `_kla_bwd_kernel` reads them: from the batch row's start with int32 offsets, unmasked where whole."""
    i_b, i_seg = tl.program_id(0).to(tl.int64), tl.program_id(2) + 1
    n_seg = tl.num_programs(2) + 1
    m0 = tl.program_id(1) * BM
    o_m = m0 + tl.arange(0, BM)  # [BM]
    o_s = tl.arange(0, S_PAD)  # [S_PAD]
    m_m, m_s = o_m < M, o_s < S
    m_sm = m_s[:, None] & m_m[None, :]  # [S_PAD, BM]
    o_sm = o_s[:, None] * M + o_m[None, :]  # [S_PAD, BM] into [S, M]
    b_a = tl.load(a_ptr + o_sm, mask=m_sm, other=1.0).to(tl.float32)
    b_p = tl.load(p_ptr + o_sm, mask=m_sm, other=0.0).to(tl.float32)
    b_a2 = b_a * b_a
    o_ckpt = (i_b * n_chunks + i_seg * seg_chunks) * S * M + o_sm  # [S_PAD, BM] into [B, NC, S, M]
    b_P = tl.load(ckpt_P_ptr + o_ckpt, mask=m_sm, other=1.0)
    b_mu = tl.load(ckpt_mu_ptr + o_ckpt, mask=m_sm, other=0.0)
    b_q11 = tl.full([S_PAD, BM], 1.0, tl.float32)  # Q starts as the identity
    b_q21 = tl.zeros([S_PAD, BM], tl.float32)
    b_q22 = tl.full([S_PAD, BM], 1.0, tl.float32)
    b_smu = tl.zeros([S_PAD, BM], tl.float32)  # Σ Q_t·e_t
    b_sP = tl.zeros([S_PAD, BM], tl.float32)
    p_v, p_lv = row_start(v_ptr, i_b * L, M, V_FMT), row_start(lam_v_ptr, i_b * L, M, LV_FMT)
    p_k, p_q = row_start(k_ptr, i_b * L, S, K_FMT), row_start(q_ptr, i_b * L, S, Q_FMT)
    p_gy, p_gyv = row_start(gy_ptr, i_b * L, M, GY_FMT), gyv_ptr
    if HAS_GYV:  # else gyv_ptr is None
        p_gyv = row_start(gyv_ptr, i_b * L, M, GYV_FMT)
    s_end, m_end = S, M  # the rows' bounds; None where they are whole (as in _kla_bwd_kernel)
    if EVEN_S:
        s_end = None
    if EVEN_M:
        m_end = None
    t1 = (i_seg + 1) * seg_chunks * CHUNK
    if t1 > L:
        t1 = L
    for t in tl.range(i_seg * seg_chunks * CHUNK, t1, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):
        b_v = load_row(row_start(p_v, t, M, V_FMT), m0, m_end, BM, V_FMT)
        b_lv = load_row(row_start(p_lv, t, M, LV_FMT), m0, m_end, BM, LV_FMT)
        b_k = load_row(row_start(p_k, t, S, K_FMT), 0, s_end, S_PAD, K_FMT)
        b_q = load_row(row_start(p_q, t, S, Q_FMT), 0, s_end, S_PAD, Q_FMT)
        if LOGVAR:
            b_lv = _precision_once(b_lv, floor)
        b_gy = load_row(row_start(p_gy, t, M, GY_FMT), m0, m_end, BM, GY_FMT)
        b_phi = b_lv[None, :] * (b_k * b_k)[:, None]  # [S_PAD, BM]
        b_r = (b_v * b_lv)[None, :] * b_k[:, None]  # [S_PAD, BM]
        b_P, b_mu, _, b_i = _filter_step(b_P, b_mu, b_a, b_a2, b_p, b_phi, b_r, FAST_RCP)
        b_u = b_a * b_i  # A_t = [[u, 0], [w, u²]]
        b_w = b_a2 * b_i * (b_r - b_mu * b_phi)
        b_q21 = b_q21 * b_u + b_q22 * b_w  # Q ← Q·A_t
        b_q11 = b_q11 * b_u
        b_q22 = b_q22 * b_u * b_u
        b_e = b_q[:, None] * b_gy[None, :]  # e_t, μ part
        if PRIOR:
            b_e = b_a * b_e
        b_smu += b_q11 * b_e
        b_sP += b_q21 * b_e
        if HAS_GYV:
            b_gyv = load_row(row_start(p_gyv, t, M, GYV_FMT), m0, m_end, BM, GYV_FMT)
            b_eP = (b_q * b_q)[:, None] * b_gyv[None, :]  # e_t, P part
            if PRIOR:
                b_eP = b_a2 * b_eP
            b_sP += b_q22 * b_eP
    o_sum = (i_b * n_seg + i_seg) * ADJOINT_SUMMARY_SIZE * S * M + o_sm  # [S_PAD, BM] into [B, n_seg, 5, S, M]
    tl.store(sum_ptr + o_sum, b_q11, mask=m_sm)
    tl.store(sum_ptr + o_sum + S * M, b_q21, mask=m_sm)
    tl.store(sum_ptr + o_sum + 2 * S * M, b_q22, mask=m_sm)
    tl.store(sum_ptr + o_sum + 3 * S * M, b_smu, mask=m_sm)
    tl.store(sum_ptr + o_sum + 4 * S * M, b_sP, mask=m_sm)


@triton.jit
def _kla_bwd_carry_kernel(
    sum_ptr, lam_out_ptr, eta_out_ptr, glam_ptr, geta_ptr, carry_ptr,
    M, S, n_seg,
    BM: tl.constexpr, S_PAD: tl.constexpr, HAS_GSTATE: tl.constexpr,
):  # fmt: skip
    """(gμ, gP) arriving at every segment's last state, [B, n_seg, 2, S, M]: the segment maps applied backwards."""
    i_b = tl.program_id(0).to(tl.int64)
    o_m = tl.program_id(1) * BM + tl.arange(0, BM)  # [BM]
    o_s = tl.arange(0, S_PAD)  # [S_PAD]
    m_sm = (o_s < S)[:, None] & (o_m < M)[None, :]  # [S_PAD, BM]
    o_sm = o_s[:, None] * M + o_m[None, :]  # [S_PAD, BM] into [S, M]
    if HAS_GSTATE:
        o_bms = i_b * M * S + o_m[None, :] * S + o_s[:, None]  # [S_PAD, BM] into [B, M, S]
        b_gmu, b_gP = _final_state_adjoint(lam_out_ptr, eta_out_ptr, glam_ptr, geta_ptr, o_bms, m_sm)
    else:
        b_gmu = tl.zeros([S_PAD, BM], tl.float32)
        b_gP = tl.zeros([S_PAD, BM], tl.float32)
    # segments n_seg - 1 .. 1, each then carried through to the end of the one before; the loads do not depend on
    # the carried adjoint, so the software pipeliner prefetches the next segment's (unconditional loads: Triton does
    # not pipeline a load under an `if`)
    for j in tl.range(n_seg - 1, num_stages=2):
        i_seg = n_seg - 1 - j
        p_carry = carry_ptr + (i_b * n_seg + i_seg) * CARRY_SIZE * S * M + o_sm
        tl.store(p_carry, b_gmu, mask=m_sm)
        tl.store(p_carry + S * M, b_gP, mask=m_sm)
        p_sum = sum_ptr + (i_b * n_seg + i_seg) * ADJOINT_SUMMARY_SIZE * S * M + o_sm
        b_q11 = tl.load(p_sum, mask=m_sm, other=0.0)
        b_q21 = tl.load(p_sum + S * M, mask=m_sm, other=0.0)
        b_q22 = tl.load(p_sum + 2 * S * M, mask=m_sm, other=0.0)
        b_smu = tl.load(p_sum + 3 * S * M, mask=m_sm, other=0.0)
        b_sP = tl.load(p_sum + 4 * S * M, mask=m_sm, other=0.0)
        b_gmu, b_gP = b_q11 * b_gmu + b_smu, b_q21 * b_gmu + b_q22 * b_gP + b_sP
    p_carry = carry_ptr + i_b * n_seg * CARRY_SIZE * S * M + o_sm  # segment 0
    tl.store(p_carry, b_gmu, mask=m_sm)
    tl.store(p_carry + S * M, b_gP, mask=m_sm)


def _adjoint_carry(rows, a_t, p_t, ckpt_P, ckpt_mu, lam, eta, glam, geta, seg_chunks, n_seg, floor, launch):
    """(gμ, gP) arriving at every time segment's last state, [B, n_seg, 2, S, M] float32 (summary and carry).

    rows: (v, lambda_v, k, q, gy, gyv) as the kernels read them (`common.as_rows`); launch: the constexprs and
    launch options the backward kernels share.
    """
    batch, n_chunks, state_size, channels = ckpt_P.shape
    n_mb, length = triton.cdiv(channels, launch["BM"]), rows[4].shape[1]
    summary = lam.new_empty(batch, n_seg, ADJOINT_SUMMARY_SIZE.value, state_size, channels)
    _kla_bwd_summary_kernel[(batch, n_mb, n_seg - 1)](
        *rows[:4], a_t, p_t, ckpt_P, ckpt_mu, *rows[4:], summary,
        length, channels, state_size, n_chunks, seg_chunks, floor, **(launch | {"UNROLL": SUMMARY_UNROLL}),
    )  # fmt: skip
    carry = lam.new_empty(batch, n_seg, CARRY_SIZE.value, state_size, channels)
    _kla_bwd_carry_kernel[(batch, n_mb)](
        summary, lam, eta, glam, geta, carry, channels, state_size, n_seg,
        BM=launch["BM"], S_PAD=launch["S_PAD"], HAS_GSTATE=glam is not None, num_warps=launch["num_warps"],
    )  # fmt: skip
    return carry


def mobius_scan_bwd(
    saved: tuple[Tensor | None, ...],
    gy: Tensor,
    gyv: Tensor,
    glam: Tensor | None,
    geta: Tensor | None,
    decode_from_prior: bool,
    config: ScanConfig,
    precision_floor: float | None = None,
    grad_dtype: torch.dtype | None = None,
) -> tuple[Tensor, ...]:
    """Launch the backward kernels and finish the reductions over batch, channel blocks and time segments.

    With `precision_floor` the forward read lambda_v as log σ² (Λ = 1/(softplus(log σ²) + precision_floor)), and
    its gradient is d/d log σ².

    Args:
        saved: (v, lambda_v, k, q, a, p, lam0, eta0, lam, eta, ckpt_P, ckpt_mu) from the forward, contiguous;
            lam0/eta0 None for a fresh sequence.
        gy: gradient of y [B, L, M], contiguous; gyv: gradient of y_var, the same or None (y_var unused: its
            terms are skipped). glam, geta: final-state gradients [B, M, S] or None.
        grad_dtype: the dtype of dv and dlambda_v (default: their inputs').
    Returns:
        (dv, dlambda_v, dk, dq, da, dp, dlam0, deta0), each in its input's dtype but for `grad_dtype`; dlam0, deta0
        None when the forward had no initial state.
    """
    v, lambda_v, k, q, a, p, lam0, eta0, lam, eta, ckpt_P, ckpt_mu = saved
    batch, length, channels = v.shape
    state_size, s_pad = k.shape[-1], state_pad(k.shape[-1])
    n_chunks = ckpt_P.shape[1]
    seg_chunks = segment_chunks(batch, length, channels, state_size, config)
    n_seg = triton.cdiv(n_chunks, seg_chunks)
    n_mb = triton.cdiv(channels, config.bwd_block_m)
    f32 = dict(device=v.device, dtype=torch.float32)
    dv, dlv = torch.empty_like(v, dtype=grad_dtype), torch.empty_like(lambda_v, dtype=grad_dtype)
    dk_part = torch.empty(batch, n_mb, length, state_size, **f32)
    dq_part = torch.empty_like(dk_part)
    da_part = torch.empty(batch, n_seg, channels, state_size, **f32)
    dp_part = torch.empty_like(da_part)
    dlam0 = deta0 = None
    if lam0 is not None:
        dlam0, deta0 = torch.empty(batch, channels, state_size, **f32), torch.empty(batch, channels, state_size, **f32)
    scr_P = torch.empty(batch, n_mb, n_seg, (config.chunk + 1) // 2, s_pad, config.bwd_block_m, **f32)
    scr_mu = torch.empty_like(scr_P)
    has_gstate = glam is not None or geta is not None
    if has_gstate:
        glam = torch.zeros_like(lam) if glam is None else glam.contiguous()  # autograd may pass expanded tensors
        geta = torch.zeros_like(eta) if geta is None else geta.contiguous()
    a_t, p_t = to_kernel_layout(a), to_kernel_layout(p)  # [S, M]: read channel-contiguous, as the hot loop wants
    rows, formats = zip(*(as_rows(x) for x in (v, lambda_v, k, q, gy, gyv)))
    formats = dict(zip(("V_FMT", "LV_FMT", "K_FMT", "Q_FMT", "GY_FMT", "GYV_FMT"), formats))
    launch = dict(
        BM=config.bwd_block_m, S_PAD=s_pad, CHUNK=config.chunk, NUM_STAGES=config.bwd_num_stages,
        PRIOR=decode_from_prior, HAS_GYV=gyv is not None, FAST_RCP=not interpreting(),
        LOGVAR=precision_floor is not None, EVEN_S=state_size == s_pad, EVEN_M=channels % config.bwd_block_m == 0,
        **formats, num_warps=config.bwd_num_warps,
    )  # fmt: skip
    carry = None
    if n_seg > 1:
        carry = _adjoint_carry(
            rows, a_t, p_t, ckpt_P, ckpt_mu, lam, eta, glam, geta, seg_chunks, n_seg, precision_floor or 0.0, launch
        )
    _kla_bwd_kernel[(batch, n_mb, n_seg)](
        *rows[:4], a_t, p_t, lam0, eta0, ckpt_P, ckpt_mu, lam, eta, *rows[4:], glam, geta,
        carry, dv, dlv, dk_part, dq_part, da_part, dp_part, dlam0, deta0, scr_P, scr_mu,
        length, channels, state_size, n_chunks, seg_chunks, precision_floor or 0.0,
        HAS_INIT=lam0 is not None, HAS_GSTATE=has_gstate, HAS_CARRY=carry is not None,
        PAIR_UNROLL=pair_unroll(config.bwd_unroll), **launch,
    )  # fmt: skip
    dk, dq = dk_part.sum(1).to(k.dtype), dq_part.sum(1).to(q.dtype)
    da, dp = da_part.sum((0, 1)).to(a.dtype), dp_part.sum((0, 1)).to(p.dtype)
    if lam0 is not None:
        dlam0, deta0 = dlam0.to(lam0.dtype), deta0.to(eta0.dtype)
    return dv, dlv, dk, dq, da, dp, dlam0, deta0
