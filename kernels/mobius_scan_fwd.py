"""Forward Triton kernels of the KLA scan (oracle: `klalm.ops.reference.kla_scan_reference`).

The filter of docs/kla.md ("The math") runs here in covariance form, which is the same map as the
information form (λ = 1/P, η = μ/P) but needs one reciprocal per (b, t, m, s) instead of two:

    P'_t = a²·P_{t-1} + p                    (predicted variance; 1/P'_t = λ_{t-1}/d_t)
    i_t  = 1 / (1 + φ_t·P'_t)                (the Möbius step, normalised so its denominator is 1)
    P_t  = P'_t·i_t                          (= 1/λ_t)
    μ_t  = i_t·(a·μ_{t-1} + r_t·P'_t)        (= η_t/λ_t)
    y_t  = Σ_s q_t·μ_t        y_var_t = Σ_s q_t²·P_t

`_kla_fwd_kernel`: one program owns one batch row, BM channels and one time segment; its [S_PAD, BM] state
lives in registers (the layout is Triton's; kernels/NOTES.md records what it chose) and walks the segment in
order. Loads of step t+1.. are prefetched into shared memory by Triton's software pipeliner (`num_stages`).
Every CHUNK steps the program saves its state, which is all the backward needs to recompute the states of one
chunk at a time (see mobius_scan_bwd.py).

Time-parallel split. With one segment (the whole of L) the kernel above is the sequential scan. When B·M·S is
too small to fill the GPU, L is cut into segments of a whole number of chunks (`common.segment_chunks`), and
two small kernels first find every segment's start state:

1. `_kla_fwd_summary_kernel`, one program per (b, m-block, segment): the segment's map from its start state to
   its end state. In homogeneous coordinates (x, w, z) with λ = x/z and η = w/z one step is linear,

       z' = p·x + a²·z        x' = x + φ·z'        w' = a·w + r·z'

   (z' = z·d_t, so x'/z' = λ/d_t + φ and w'/z' = (a/d_t)·η + r), so a segment is the product of its steps'
   3×3 matrices. The w column of every product is (0, Tww, 0), so 7 numbers per (b, m, s) hold it:

       λ_end = (Txx·λ + Txz) / (Tzx·λ + Tzz)          η_end = (Twx·λ + Tww·η + Twz) / (Tzx·λ + Tzz)

   A matrix and its multiples are the same map, so the product is divided after every step by
   Txx + Txz + Tzx + Tzz (all four ≥ 0: nothing overflows, and what underflows is negligible against them).
2. `_kla_fwd_carry_kernel`, one program per (b, m-block): applies the segment maps in order from the initial
   state and writes every segment's start, which `_kla_fwd_kernel` then reads as its initial state. It works in
   covariance form, the map above with numerator and denominator divided by λ (P = 1/λ, μ = η/λ):

       P_end = (Tzx + Tzz·P) / (Txx + Txz·P)          μ_end = (Twx + Tww·μ + Twz·P) / (Txx + Txz·P)

   which stays finite where λ overflows float32 and P underflows to 0 (p = 0 with a < 1: λ grows like a^(−2t)),
   as the sequential walk does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from klalm.kernels.common import (
    BF16_PAIRS,
    PLAIN,
    ScanConfig,
    as_rows,
    interpreting,
    load_row,
    load_row_spread,
    rcp,
    row_start,
    segment_chunks,
    state_pad,
)

SUMMARY_SIZE = tl.constexpr(7)  # numbers per (b, m, s) of a segment's forward map: Txx, Txz, Tzx, Tzz, Twx, Tww, Twz


@triton.jit
def _filter_step(b_P, b_mu, b_a, b_a2, b_p, b_phi, b_r, FAST_RCP: tl.constexpr):
    """One predict+update step in covariance form; returns (P_t, μ_t, P'_t, i_t), each [S_PAD, BM]."""
    b_Pp = b_a2 * b_P + b_p
    b_i = rcp(1.0 + b_phi * b_Pp, FAST_RCP)
    return b_Pp * b_i, b_i * (b_a * b_mu + b_r * b_Pp), b_Pp, b_i


@triton.jit
def _precision(b_x, floor):
    """Λ = 1/(softplus(x) + floor) from log σ² = x, float32 (oracle: `klalm.ops.reference.precision_from_logvar`).

    softplus(x) = max(x, 0) + log(1 + u) with u = exp(−|x|) ∈ (0, 1]; log(1 + u) is computed as
    log(w)·u/(w − 1) with w = 1 + u (exact to a few ulp even where w rounds to 1).
    """
    b_u = tl.exp(-tl.abs(b_x))
    b_w = 1.0 + b_u
    b_log1p = tl.where(b_w == 1.0, b_u, tl.log(b_w) * (b_u / tl.where(b_w == 1.0, 1.0, b_w - 1.0)))
    return 1.0 / (tl.maximum(b_x, 0.0) + b_log1p + floor)


@triton.jit
def _precision_once(b_x, floor):
    """`_precision` of a row b_x [BM] with each element computed in one lane. Written on b_x itself, Triton computes
    it in the layout where the row meets the [S_PAD, BM] state, in which every channel sits in S_PAD/4 lanes: the
    softplus, logarithm, exponential and two divisions done 4 times over (at S_PAD = 16). Here the row is a [BM, 1]
    column whose single column is reduced at the end (no arithmetic); the reduction fixes the layout, so the work
    stays one element per lane. Λ (and v·Λ, which Triton then also forms one per lane) cross into the state's
    layout through shared memory: two exchanges per step. The values are bitwise `_precision(b_x, floor)`."""
    return tl.max(_precision(b_x[:, None], floor), axis=1)


@triton.jit
def _precision_slope(b_x, b_lv):
    """dΛ/dx of Λ = 1/(softplus(x) + floor): −Λ²·sigmoid(x), sigmoid written so that exp never overflows."""
    b_u = tl.exp(-tl.abs(b_x))
    return -b_lv * b_lv * tl.where(b_x >= 0.0, 1.0, b_u) / (1.0 + b_u)


@triton.jit
def _row_at(ptr, t, stride, FMT: tl.constexpr, HALVED: tl.constexpr):
    """`common.row_start`; with HALVED a paired row's stride is halved before the product (the stride is even):
    t·(stride/2) is one multiply-add per step where (t·stride)/2, a signed division, is three."""
    if HALVED and FMT != PLAIN:
        return ptr + t * (stride // 2)
    else:
        return row_start(ptr, t, stride, FMT)


@triton.jit
def _load_row_spread(ptr, start, limit, N: tl.constexpr, FMT: tl.constexpr, PTX: tl.constexpr):
    """`common.load_row_spread`; with PTX a bf16 element is moved into the high half of its float32 by one `prmt`
    (a per-lane byte selector: the word's low or high half over two zero bytes) instead of two shifts."""
    if PTX and FMT == BF16_PAIRS:
        i = tl.arange(0, N)
        w = tl.load(ptr + (start // 2 + i // 2), mask=start + i < limit, other=0)
        sel = 0x1044 + (i % 2) * 0x2200  # bytes (0, 0, w0, w1) for the low half, (0, 0, w2, w3) for the high
        x = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, $2;", "=r,r,r", [w, sel], dtype=tl.int32, is_pure=True,
                                      pack=1)  # fmt: skip
        return x.to(tl.float32, bitcast=True)
    else:
        return load_row_spread(ptr, start, limit, N, FMT)


@triton.jit
def _load_step(
    v_ptr, lam_v_ptr, k_ptr, q_ptr, row_m, row_s, m0, M, S,
    BM: tl.constexpr, S_PAD: tl.constexpr,
    V_FMT: tl.constexpr, LV_FMT: tl.constexpr, K_FMT: tl.constexpr, Q_FMT: tl.constexpr, SPREAD: tl.constexpr,
    PTX: tl.constexpr = False,
):  # fmt: skip
    """One step's v, Λ [BM] (channels m0..) and k, q [S_PAD] as float32, padding 0; row_m, row_s: element offsets
    of the step's [M] and [S] rows; *_FMT: each tensor's `common.load_row` format. SPREAD: the caller's layout puts
    neighbouring channels in different lanes (the forward kernels), so 16-bit v, Λ rows are read with
    `common.load_row_spread`; the backward keeps them in one lane and reads words of two (`common.load_row`).
    PTX: compiled, not interpreted, and the forward's TRIM_16BIT: bf16 v, Λ halves are placed with one `prmt`."""
    if SPREAD:
        b_v = _load_row_spread(v_ptr, row_m + m0, row_m + M, BM, V_FMT, PTX)
        b_lv = _load_row_spread(lam_v_ptr, row_m + m0, row_m + M, BM, LV_FMT, PTX)
    else:
        b_v = load_row(v_ptr, row_m + m0, row_m + M, BM, V_FMT)
        b_lv = load_row(lam_v_ptr, row_m + m0, row_m + M, BM, LV_FMT)
    b_k = load_row(k_ptr, row_s, row_s + S, S_PAD, K_FMT)
    b_q = load_row(q_ptr, row_s, row_s + S, S_PAD, Q_FMT)
    return b_v, b_lv, b_k, b_q


@triton.jit
def _store_row_pairs(ptr, x, start, limit, N: tl.constexpr, FMT: tl.constexpr, PTX: tl.constexpr):
    """Store x [N] (float32) rounded to 16 bits as elements [start, start + N) of a flat 16-bit tensor whose int32
    view is ptr (FMT BF16_PAIRS or FP16_PAIRS; start, limit even), positions >= limit skipped: words of two
    elements, so the exchange into the store's layout moves float32 pairs (one vector store per lane) instead of
    one 16-bit store per element."""
    lo, hi = tl.split(tl.reshape(x, [N // 2, 2]))
    if PTX:  # one cvt.rn of both halves into one word (F2FP.PACK_AB), the rounding of .to() below
        if FMT == BF16_PAIRS:
            w = tl.inline_asm_elementwise(
                "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi], dtype=tl.int32, is_pure=True, pack=1
            )
        else:
            w = tl.inline_asm_elementwise(
                "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi], dtype=tl.int32, is_pure=True, pack=1
            )
    else:
        if FMT == BF16_PAIRS:
            lo = lo.to(tl.bfloat16).to(tl.int16, bitcast=True)
            hi = hi.to(tl.bfloat16).to(tl.int16, bitcast=True)
        else:
            lo = lo.to(tl.float16).to(tl.int16, bitcast=True)
            hi = hi.to(tl.float16).to(tl.int16, bitcast=True)
        w = (lo.to(tl.int32) & 65535) | (hi.to(tl.int32) << 16)
    o = start // 2 + tl.arange(0, N // 2)
    tl.store(ptr + o, w, mask=o < limit // 2)


@triton.jit
def _kla_fwd_kernel(
    v_ptr, lam_v_ptr, k_ptr, q_ptr, a_ptr, p_ptr, lam0_ptr, eta0_ptr,
    y_ptr, y_var_ptr, lam_out_ptr, eta_out_ptr, ckpt_P_ptr, ckpt_mu_ptr,
    L, M, S, n_chunks, seg_chunks, floor,
    BM: tl.constexpr, S_PAD: tl.constexpr, CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr, UNROLL: tl.constexpr,
    HAS_INIT: tl.constexpr, PRIOR: tl.constexpr, SAVE_CKPT: tl.constexpr, FAST_RCP: tl.constexpr,
    LOGVAR: tl.constexpr, V_FMT: tl.constexpr, LV_FMT: tl.constexpr, K_FMT: tl.constexpr, Q_FMT: tl.constexpr,
    INIT_COV: tl.constexpr, WITH_VAR: tl.constexpr, Y_FMT: tl.constexpr,
):  # fmt: skip
    i_b, i_seg = tl.program_id(0).to(tl.int64), tl.program_id(2)
    n_seg = tl.num_programs(2)
    m0 = tl.program_id(1) * BM
    o_m = m0 + tl.arange(0, BM)  # [BM]
    o_s = tl.arange(0, S_PAD)  # [S_PAD]
    m_m, m_s = o_m < M, o_s < S
    m_sm = m_s[:, None] & m_m[None, :]  # [S_PAD, BM]
    o_ms = o_m[None, :] * S + o_s[:, None]  # [S_PAD, BM] into [M, S] (read and written once per program)
    b_a = tl.load(a_ptr + o_ms, mask=m_sm, other=1.0).to(tl.float32)
    b_p = tl.load(p_ptr + o_ms, mask=m_sm, other=0.0).to(tl.float32)
    b_a2 = b_a * b_a
    if HAS_INIT:  # [B, n_seg, M, S]: the caller's (λ0, η0) (one segment), or every segment's start (P, μ) (INIT_COV)
        o_init = (i_b * n_seg + i_seg) * M * S + o_ms
        b_x0 = tl.load(lam0_ptr + o_init, mask=m_sm, other=1.0).to(tl.float32)
        b_x1 = tl.load(eta0_ptr + o_init, mask=m_sm, other=0.0).to(tl.float32)
        if INIT_COV:
            b_P, b_mu = b_x0, b_x1
        else:
            b_P = 1.0 / b_x0
            b_mu = b_x1 * b_P
    else:
        b_P = tl.full([S_PAD, BM], 1.0, tl.float32)
        b_mu = tl.zeros([S_PAD, BM], tl.float32)
    o_ckpt = (i_b * n_chunks * S + o_s[:, None]) * M + o_m[None, :]  # [S_PAD, BM] into [B, NC, S, M]
    # the batch row's start (64-bit, once); within it the steps index with int32 offsets (`common.row_start`)
    v_row, lv_row = row_start(v_ptr, i_b * L, M, V_FMT), row_start(lam_v_ptr, i_b * L, M, LV_FMT)
    k_row, q_row = row_start(k_ptr, i_b * L, S, K_FMT), row_start(q_ptr, i_b * L, S, Q_FMT)
    y_row, yv_row = row_start(y_ptr, i_b * L, M, Y_FMT), y_var_ptr + i_b * L * M
    # TRIM_16BIT: three trims of the 16-bit forward (y stored as words of two, `_store_row_pairs`, where the caller
    # passes y paired, Y_FMT; bf16 v, Λ unpacked by one `prmt`; paired row addresses as t·(stride/2), `_row_at`),
    # kept to the one case an H200 timed faster (results/gpu_2026-12-01i/call1/dtypes_*.md, B16 L2048 M1024 S16,
    # ms without -> with): Λ given, no y_var (a KLA layer in training), bf16 0.544 -> 0.526 (fp32 rows: 0.525),
    # fp16 0.551 -> 0.544. With y_var (bf16 0.609 -> 0.630) and from log σ² (bf16 0.835 -> 0.855) they were slower,
    # so those cases compile as without them (float32 rows have nothing to trim).
    TRIM_16BIT: tl.constexpr = not LOGVAR and not WITH_VAR
    tl.static_assert(Y_FMT == PLAIN or TRIM_16BIT, "y is passed as words of two only with TRIM_16BIT")
    c1 = (i_seg + 1) * seg_chunks
    if c1 > n_chunks:
        c1 = n_chunks
    for i_c in range(i_seg * seg_chunks, c1):
        if SAVE_CKPT:
            o_c = o_ckpt + i_c * S * M
            tl.store(ckpt_P_ptr + o_c, b_P, mask=m_sm)
            tl.store(ckpt_mu_ptr + o_c, b_mu, mask=m_sm)
        t1 = (i_c + 1) * CHUNK
        if t1 > L:
            t1 = L
        for t in tl.range(i_c * CHUNK, t1, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):
            row_m = t * M  # int32 within the batch row
            b_v, b_lv, b_k, b_q = _load_step(
                _row_at(v_row, t, M, V_FMT, TRIM_16BIT), _row_at(lv_row, t, M, LV_FMT, TRIM_16BIT),
                _row_at(k_row, t, S, K_FMT, TRIM_16BIT), _row_at(q_row, t, S, Q_FMT, TRIM_16BIT), 0, 0, m0, M, S,
                BM, S_PAD, V_FMT, LV_FMT, K_FMT, Q_FMT, True, FAST_RCP and TRIM_16BIT,
            )  # fmt: skip
            if LOGVAR:  # the tensor holds log σ²
                b_lv = _precision_once(b_lv, floor)
            b_phi = b_lv[None, :] * (b_k * b_k)[:, None]  # [S_PAD, BM]
            b_r = (b_v * b_lv)[None, :] * b_k[:, None]  # [S_PAD, BM]
            b_P, b_mu, _, _ = _filter_step(b_P, b_mu, b_a, b_a2, b_p, b_phi, b_r, FAST_RCP)
            b_mean = b_a * b_mu if PRIOR else b_mu
            b_y = tl.sum(b_q[:, None] * b_mean, axis=0)  # [BM]
            if WITH_VAR:  # off when no one reads y_var (a KLA layer in training): its products, sum and store
                b_var = b_a2 * b_P + b_p if PRIOR else b_P
                b_yv = tl.sum((b_q * b_q)[:, None] * b_var, axis=0)  # [BM]
                # y and y_var as one [BM, 2] store: one layout exchange (a shared-memory round trip) per step
                b_out = tl.join(b_y, b_yv).to(y_ptr.dtype.element_ty)
                tl.store(tl.join(y_row + row_m + o_m, yv_row + row_m + o_m), b_out, mask=m_m[:, None])
            elif Y_FMT == PLAIN:
                tl.store(y_row + row_m + o_m, b_y.to(y_ptr.dtype.element_ty), mask=m_m)
            else:
                # 16-bit y as words of two (FAST_RCP: compiled, so the packing may be inline PTX)
                _store_row_pairs(_row_at(y_row, t, M, Y_FMT, TRIM_16BIT), b_y, m0, M, BM, Y_FMT, FAST_RCP)
    if i_seg == n_seg - 1:
        b_lam = 1.0 / b_P
        tl.store(lam_out_ptr + i_b * M * S + o_ms, b_lam, mask=m_sm)
        tl.store(eta_out_ptr + i_b * M * S + o_ms, b_mu * b_lam, mask=m_sm)


@triton.jit
def _kla_fwd_summary_kernel(
    v_ptr, lam_v_ptr, k_ptr, a_ptr, p_ptr, sum_ptr,
    L, M, S, seg_steps, floor,
    BM: tl.constexpr, S_PAD: tl.constexpr, NUM_STAGES: tl.constexpr, UNROLL: tl.constexpr, FAST_RCP: tl.constexpr,
    LOGVAR: tl.constexpr, EVEN_S: tl.constexpr, EVEN_M: tl.constexpr, V_FMT: tl.constexpr, LV_FMT: tl.constexpr,
    K_FMT: tl.constexpr,
):  # fmt: skip
    """The map of segment i_seg (every segment but the last) as 7 numbers per (b, m, s) (module docstring). The rows
    are read from the batch row's start with int32 offsets (`common.row_start`), without a per-lane mask where they
    are whole (EVEN_S: S == S_PAD; EVEN_M: M % BM == 0)."""
    i_b, i_seg = tl.program_id(0).to(tl.int64), tl.program_id(2)
    n_seg = tl.num_programs(2) + 1
    m0 = tl.program_id(1) * BM
    o_m = m0 + tl.arange(0, BM)  # [BM]
    o_s = tl.arange(0, S_PAD)  # [S_PAD]
    m_m, m_s = o_m < M, o_s < S
    m_sm = m_s[:, None] & m_m[None, :]  # [S_PAD, BM]
    o_ms = o_m[None, :] * S + o_s[:, None]  # [S_PAD, BM] into [M, S]
    b_a = tl.load(a_ptr + o_ms, mask=m_sm, other=1.0).to(tl.float32)
    b_p = tl.load(p_ptr + o_ms, mask=m_sm, other=0.0).to(tl.float32)
    b_a2 = b_a * b_a
    b_xx = tl.full([S_PAD, BM], 1.0, tl.float32)  # the identity map
    b_xz = tl.zeros([S_PAD, BM], tl.float32)
    b_zx = tl.zeros([S_PAD, BM], tl.float32)
    b_zz = tl.full([S_PAD, BM], 1.0, tl.float32)
    b_wx = tl.zeros([S_PAD, BM], tl.float32)
    b_ww = tl.full([S_PAD, BM], 1.0, tl.float32)
    b_wz = tl.zeros([S_PAD, BM], tl.float32)
    v_row, lv_row = row_start(v_ptr, i_b * L, M, V_FMT), row_start(lam_v_ptr, i_b * L, M, LV_FMT)
    k_row = row_start(k_ptr, i_b * L, S, K_FMT)
    s_end, m_end = S, M
    if EVEN_S:
        s_end = None
    if EVEN_M:
        m_end = None
    for t in tl.range(i_seg * seg_steps, (i_seg + 1) * seg_steps, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):
        b_v = load_row_spread(row_start(v_row, t, M, V_FMT), m0, m_end, BM, V_FMT)
        b_lv = load_row_spread(row_start(lv_row, t, M, LV_FMT), m0, m_end, BM, LV_FMT)
        b_k = load_row(row_start(k_row, t, S, K_FMT), 0, s_end, S_PAD, K_FMT)
        if LOGVAR:
            b_lv = _precision_once(b_lv, floor)
        b_phi = b_lv[None, :] * (b_k * b_k)[:, None]  # [S_PAD, BM]
        b_r = (b_v * b_lv)[None, :] * b_k[:, None]  # [S_PAD, BM]
        b_zx = b_p * b_xx + b_a2 * b_zx  # the step's matrix times the running product, z row first
        b_zz = b_p * b_xz + b_a2 * b_zz
        b_xx += b_phi * b_zx
        b_xz += b_phi * b_zz
        b_wx = b_a * b_wx + b_r * b_zx
        b_wz = b_a * b_wz + b_r * b_zz
        b_ww = b_a * b_ww
        b_n = rcp(b_xx + b_xz + b_zx + b_zz, FAST_RCP)
        b_xx, b_xz, b_zx, b_zz = b_xx * b_n, b_xz * b_n, b_zx * b_n, b_zz * b_n
        b_wx, b_ww, b_wz = b_wx * b_n, b_ww * b_n, b_wz * b_n
    o_sum = (i_b * n_seg + i_seg) * SUMMARY_SIZE * S * M + o_s[:, None] * M + o_m[None, :]  # [B, n_seg, 7, S, M]
    tl.store(sum_ptr + o_sum, b_xx, mask=m_sm)
    tl.store(sum_ptr + o_sum + S * M, b_xz, mask=m_sm)
    tl.store(sum_ptr + o_sum + 2 * S * M, b_zx, mask=m_sm)
    tl.store(sum_ptr + o_sum + 3 * S * M, b_zz, mask=m_sm)
    tl.store(sum_ptr + o_sum + 4 * S * M, b_wx, mask=m_sm)
    tl.store(sum_ptr + o_sum + 5 * S * M, b_ww, mask=m_sm)
    tl.store(sum_ptr + o_sum + 6 * S * M, b_wz, mask=m_sm)


@triton.jit
def _kla_fwd_carry_kernel(
    sum_ptr, lam0_ptr, eta0_ptr, start_P_ptr, start_mu_ptr,
    M, S, n_seg,
    BM: tl.constexpr, S_PAD: tl.constexpr, HAS_INIT: tl.constexpr,
):  # fmt: skip
    """Every segment's start (P, μ), [B, n_seg, M, S]: the initial state carried through the segment maps in order,
    in covariance form (module docstring)."""
    i_b = tl.program_id(0).to(tl.int64)
    o_m = tl.program_id(1) * BM + tl.arange(0, BM)  # [BM]
    o_s = tl.arange(0, S_PAD)  # [S_PAD]
    m_sm = (o_s < S)[:, None] & (o_m < M)[None, :]  # [S_PAD, BM]
    o_ms = o_m[None, :] * S + o_s[:, None]  # [S_PAD, BM] into [M, S]
    o_sm = o_s[:, None] * M + o_m[None, :]  # [S_PAD, BM] into [S, M]
    if HAS_INIT:
        b_P = 1.0 / tl.load(lam0_ptr + i_b * M * S + o_ms, mask=m_sm, other=1.0).to(tl.float32)
        b_mu = tl.load(eta0_ptr + i_b * M * S + o_ms, mask=m_sm, other=0.0).to(tl.float32) * b_P
    else:
        b_P = tl.full([S_PAD, BM], 1.0, tl.float32)
        b_mu = tl.zeros([S_PAD, BM], tl.float32)
    o_start = i_b * n_seg * M * S + o_ms
    tl.store(start_P_ptr + o_start, b_P, mask=m_sm)
    tl.store(start_mu_ptr + o_start, b_mu, mask=m_sm)
    for i_seg in tl.range(n_seg - 1, num_stages=2):  # the pipeliner prefetches the next segment's map
        p_sum = sum_ptr + (i_b * n_seg + i_seg) * SUMMARY_SIZE * S * M + o_sm
        b_xx = tl.load(p_sum, mask=m_sm, other=1.0)
        b_xz = tl.load(p_sum + S * M, mask=m_sm, other=0.0)
        b_zx = tl.load(p_sum + 2 * S * M, mask=m_sm, other=0.0)
        b_zz = tl.load(p_sum + 3 * S * M, mask=m_sm, other=1.0)
        b_wx = tl.load(p_sum + 4 * S * M, mask=m_sm, other=0.0)
        b_ww = tl.load(p_sum + 5 * S * M, mask=m_sm, other=1.0)
        b_wz = tl.load(p_sum + 6 * S * M, mask=m_sm, other=0.0)
        b_inv = 1.0 / (b_xx + b_xz * b_P)
        b_P, b_mu = (b_zx + b_zz * b_P) * b_inv, (b_wx + b_ww * b_mu + b_wz * b_P) * b_inv
        o_start += M * S
        tl.store(start_P_ptr + o_start, b_P, mask=m_sm)
        tl.store(start_mu_ptr + o_start, b_mu, mask=m_sm)


def _segment_starts(v, lambda_v, k, a, p, lam0, eta0, seg_steps: int, n_seg: int, config: ScanConfig, floor):
    """Start (P, μ) of every time segment, each [B, n_seg, M, S] float32 (summary and carry kernels)."""
    batch, length, channels = v.shape
    state_size = k.shape[-1]
    n_mb, s_pad = triton.cdiv(channels, config.block_m), state_pad(state_size)
    (v, v_fmt), (lambda_v, lv_fmt), (k, k_fmt) = as_rows(v), as_rows(lambda_v), as_rows(k)
    summary = v.new_empty(batch, n_seg, SUMMARY_SIZE.value, state_size, channels, dtype=torch.float32)
    _kla_fwd_summary_kernel[(batch, n_mb, n_seg - 1)](
        v, lambda_v, k, a, p, summary, length, channels, state_size, seg_steps, floor or 0.0,
        BM=config.block_m, S_PAD=s_pad, NUM_STAGES=config.num_stages, UNROLL=config.unroll,
        FAST_RCP=not interpreting(), LOGVAR=floor is not None, EVEN_S=state_size == s_pad,
        EVEN_M=channels % config.block_m == 0, V_FMT=v_fmt, LV_FMT=lv_fmt, K_FMT=k_fmt, num_warps=config.num_warps,
    )  # fmt: skip
    start_P = v.new_empty(batch, n_seg, channels, state_size, dtype=torch.float32)
    start_mu = torch.empty_like(start_P)
    _kla_fwd_carry_kernel[(batch, n_mb)](
        summary, lam0, eta0, start_P, start_mu, channels, state_size, n_seg,
        BM=config.block_m, S_PAD=s_pad, HAS_INIT=lam0 is not None, num_warps=config.num_warps,
    )  # fmt: skip
    return start_P, start_mu


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
    precision_floor: float | None = None,
    with_variance: bool = True,
    out_dtype: torch.dtype | None = None,
    ckpt: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """Launch the forward kernels on contiguous inputs (checked by the caller).

    Shapes: v, lambda_v [B, L, M]; k, q [B, L, S]; a, p [M, S]; lam0, eta0 [B, M, S] or None (fresh).
    With `precision_floor`, lambda_v holds log σ² and the kernels use Λ = 1/(softplus(log σ²) + precision_floor).
    The kernels read and write state-shaped tensors once per program in their own [.., M, S] layout; only the
    chunk states, touched every chunk, are stored channel-contiguous. Time segments (`common.segment_chunks`)
    run in parallel from start states found by the summary and carry kernels.
    Returns y, y_var [B, L, M] in `out_dtype` (default v's dtype; y_var empty, never computed, without
    `with_variance`); final λ, η [B, M, S] float32; and, when `save_ckpt`, the states (P, μ) before every chunk,
    each [B, NC, S, M] float32 with NC = ceil(L / chunk), written into `ckpt` when given (contiguous, that shape),
    else None.
    """
    batch, length, channels = v.shape
    state_size = k.shape[-1]
    n_chunks = triton.cdiv(length, config.chunk)
    seg_chunks = segment_chunks(batch, length, channels, state_size, config)
    n_seg = triton.cdiv(n_chunks, seg_chunks)
    if n_seg > 1:
        seg_steps = seg_chunks * config.chunk
        lam0, eta0 = _segment_starts(v, lambda_v, k, a, p, lam0, eta0, seg_steps, n_seg, config, precision_floor)
        # from here lam0, eta0 hold every segment's start (P, μ): INIT_COV
    y = torch.empty_like(v, dtype=out_dtype)
    y_var = torch.empty_like(y) if with_variance else v.new_empty(0)
    lam = v.new_empty(batch, channels, state_size, dtype=torch.float32)
    eta = torch.empty_like(lam)
    ckpt_P = ckpt_mu = None
    if save_ckpt:
        if ckpt is None:
            ckpt = tuple(v.new_empty(batch, n_chunks, state_size, channels, dtype=torch.float32) for _ in range(2))
        ckpt_P, ckpt_mu = ckpt
    grid = (batch, triton.cdiv(channels, config.block_m), n_seg)
    (v, v_fmt), (lambda_v, lv_fmt), (k, k_fmt), (q, q_fmt) = (as_rows(x) for x in (v, lambda_v, k, q))
    # a 16-bit y is stored as words of two (`_store_row_pairs`) where the kernel's TRIM_16BIT holds (Λ given, no y_var)
    trim_16bit = precision_floor is None and not with_variance
    y_rows, y_fmt = as_rows(y) if trim_16bit else (y, PLAIN.value)
    _kla_fwd_kernel[grid](
        v, lambda_v, k, q, a, p, lam0, eta0, y_rows, y_var if with_variance else y, lam, eta, ckpt_P, ckpt_mu,
        length, channels, state_size, n_chunks, seg_chunks, precision_floor or 0.0,
        BM=config.block_m, S_PAD=state_pad(state_size), CHUNK=config.chunk,
        NUM_STAGES=config.num_stages, UNROLL=config.unroll,
        HAS_INIT=lam0 is not None, PRIOR=decode_from_prior, SAVE_CKPT=save_ckpt,
        FAST_RCP=not interpreting(), LOGVAR=precision_floor is not None,
        V_FMT=v_fmt, LV_FMT=lv_fmt, K_FMT=k_fmt, Q_FMT=q_fmt, INIT_COV=n_seg > 1, WITH_VAR=with_variance,
        Y_FMT=y_fmt, num_warps=config.num_warps,
    )  # fmt: skip
    return y, y_var, lam, eta, ckpt_P, ckpt_mu
