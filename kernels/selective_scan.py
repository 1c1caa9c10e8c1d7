"""`selective_scan_triton`: fused Triton forward and backward of Mamba-1's selective scan (backend "triton").

Oracle: `klalm.ops.selective_scan.selective_scan_reference` (same arguments and results):

    h_t = exp(Δ_t·A) ⊙ h_{t-1} + (Δ_t·u_t) ⊗ B_t        y_t = h_t · C_t + D ⊙ u_t

The machinery is the KLA scan's (mobius_scan_fwd.py; shared helpers in common.py): one program per batch row,
BM channels and one time segment, the [N_PAD, BM] state in registers, time walked in order with the loads
pipelined (16-bit rows read in pairs), the state saved every CHUNK steps. The backward recomputes each chunk's
states, keeping every other one in a per-program scratch buffer (the state between is recomputed in the reverse
walk from the one before it, as the reverse step does anyway for the state after its step), and runs the reverse
recursion gh_{t-1} = exp(Δ_t·A)·gh_t, with
gh_t += gy_t·C_t at each step; dB and dC (sums over m) leave one [N] row per (program, t) in a [B, M/BM, L, N]
buffer, dA and dD are summed over t in registers; the caller finishes those sums. No atomics: deterministic.

Time-parallel split (`common.segment_chunks`, as for KLA): the recurrence is affine in h, so a segment's map is
h_end = G·h_start + H with G = Π exp(Δ_t·A) and H the segment run from h = 0 (`_ss_fwd_summary_kernel`); a carry
kernel chains the maps into every segment's start state. Backwards, with e_t = C_t·gy_t, the adjoint passed from a
segment to the state before it is Q·g_end + Σ_t Q_t·e_t with Q_t = Π_{s0 < τ ≤ t} exp(Δ_τ·A), accumulated
walking the segment forwards (`_ss_bwd_summary_kernel`), and chained backwards from the final-state gradient.
The two ops are torch custom ops (`klalm::selective_scan_fwd` / `_bwd`), so torch.compile traces a Mamba layer
without a graph break.
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
    check_config,
    check_kernel_device,
    check_offsets,
    from_kernel_layout,
    load_row,
    load_row_spread,
    pair_unroll,
    row_start,
    segment_chunks,
    state_pad,
    store_reduced_row,
    to_kernel_layout,
)

MAX_STATE_SIZE = 64
DEFAULT_CONFIG = ScanConfig(  # fastest fwd and fwd+bwd measured on an H200 (kernels/NOTES.md)
    block_m=16, chunk=64, num_warps=1, num_stages=3, unroll=4,
    bwd_block_m=8, bwd_num_warps=1, bwd_num_stages=3, bwd_unroll=2,  # 2 since the half-scratch backward
)  # fmt: skip
# Where the automatic split cuts time into segments (B·M·N below common.SEQUENTIAL_MIN_CHAINS), half the backward's
# channel block was faster at every length timed (16,384 tokens a call, M1536 N16, L 4,096 to 65,536: f+b(y) 0.86-0.89x
# with fp32 u, B, C and 0.94-0.97x with bf16; results/gpu_2026-12-03d/call1/kernels.md). Over the sequential walk it
# was faster at some shapes and slower at others (B8 L2048 M1536: 1.13x fp32, 1.15x bf16), so DEFAULT_CONFIG keeps 8.
SPLIT_CONFIG = DEFAULT_CONFIG._replace(bwd_block_m=16)
LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x·log2 e)
PAIR = tl.constexpr(2)  # numbers per (b, m, n) of a segment map: (G, H) forwards, (Q, Σ Q_t·e_t) backwards


@triton.jit
def _ss_load_step(
    u_ptr, dt_ptr, B_ptr, C_ptr, t, row_m, row_n, m0, M, N,
    BM: tl.constexpr, N_PAD: tl.constexpr,
    U_FMT: tl.constexpr, DT_FMT: tl.constexpr, B_FMT: tl.constexpr, C_FMT: tl.constexpr, SPREAD: tl.constexpr,
):  # fmt: skip
    """One step's u, Δ [BM] (channels m0..) and B, C [N_PAD] as float32, padding 0 (`common.load_row` formats): the
    elements row_m + m0.. and row_n.. of row t of each pointer (`common.row_start`). Two ways to call it:
    - the forward kernels: pointers at one batch row's start, t the step, row_m = row_n = 0. The step then adds int32
      offsets t·M, t·N (`common.check_offsets`) and the masks stay the same at every t;
    - the backward kernels: the tensors' starts, t = 0, 64-bit row_m = (b·L + t)·M and row_n = (b·L + t)·N. The
      forward's way, there, compiled to fewer instructions but a bf16 reverse walk whose shuffle reductions ptxas
      overlapped less, and that loop is latency-bound: it ran slower on the H200.
    SPREAD reads B and C with `common.load_row_spread` (16-bit rows: each lane reads the word holding its state and
    keeps its half, where `load_row` unpacks each word in one lane and exchanges the halves by shuffles at every
    step; float32 rows are read the same either way). The backward kernel sets it."""
    b_u = load_row(row_start(u_ptr, t, M, U_FMT), row_m + m0, row_m + M, BM, U_FMT)
    b_dt = load_row(row_start(dt_ptr, t, M, DT_FMT), row_m + m0, row_m + M, BM, DT_FMT)
    if SPREAD:
        b_B = load_row_spread(row_start(B_ptr, t, N, B_FMT), row_n, row_n + N, N_PAD, B_FMT)
        b_C = load_row_spread(row_start(C_ptr, t, N, C_FMT), row_n, row_n + N, N_PAD, C_FMT)
    else:
        b_B = load_row(row_start(B_ptr, t, N, B_FMT), row_n, row_n + N, N_PAD, B_FMT)
        b_C = load_row(row_start(C_ptr, t, N, C_FMT), row_n, row_n + N, N_PAD, C_FMT)
    return b_u, b_dt, b_B, b_C


@triton.jit
def _ss_fwd_kernel(
    u_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, h0_ptr, y_ptr, h_out_ptr, ckpt_ptr,
    L, M, N, n_chunks, seg_chunks,
    BM: tl.constexpr, N_PAD: tl.constexpr, CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr, UNROLL: tl.constexpr,
    HAS_D: tl.constexpr, HAS_INIT: tl.constexpr, SAVE_CKPT: tl.constexpr,
    U_FMT: tl.constexpr, DT_FMT: tl.constexpr, B_FMT: tl.constexpr, C_FMT: tl.constexpr,
):  # fmt: skip
    i_b, i_seg = tl.program_id(0).to(tl.int64), tl.program_id(2)
    n_seg = tl.num_programs(2)
    m0 = tl.program_id(1) * BM
    o_m = m0 + tl.arange(0, BM)  # [BM]
    o_n = tl.arange(0, N_PAD)  # [N_PAD]
    m_m, m_n = o_m < M, o_n < N
    m_nm = m_n[:, None] & m_m[None, :]  # [N_PAD, BM]
    o_nm = o_n[:, None] * M + o_m[None, :]  # [N_PAD, BM] into [N, M]
    b_A2 = tl.load(A_ptr + o_nm, mask=m_nm, other=0.0).to(tl.float32) * LOG2E
    b_D = tl.load(D_ptr + o_m, mask=m_m, other=0.0).to(tl.float32) if HAS_D else tl.zeros([BM], tl.float32)
    if HAS_INIT:  # [B, n_seg, N, M]: the caller's initial state (one segment) or every segment's start
        b_h = tl.load(h0_ptr + (i_b * n_seg + i_seg) * M * N + o_nm, mask=m_nm, other=0.0).to(tl.float32)
    else:
        b_h = tl.zeros([N_PAD, BM], tl.float32)
    o_ckpt = (i_b * n_chunks * N + o_n[:, None]) * M + o_m[None, :]  # [N_PAD, BM] into [B, NC, N, M]
    # the batch row's start (64-bit, once); within it every step offsets by int32 t·M, t·N (`_ss_load_step`)
    p_u, p_dt = row_start(u_ptr, i_b * L, M, U_FMT), row_start(dt_ptr, i_b * L, M, DT_FMT)
    p_B, p_C = row_start(B_ptr, i_b * L, N, B_FMT), row_start(C_ptr, i_b * L, N, C_FMT)
    p_y = y_ptr + i_b * L * M
    c1 = (i_seg + 1) * seg_chunks
    if c1 > n_chunks:
        c1 = n_chunks
    for i_c in range(i_seg * seg_chunks, c1):
        if SAVE_CKPT:
            tl.store(ckpt_ptr + o_ckpt + i_c * N * M, b_h, mask=m_nm)
        t1 = (i_c + 1) * CHUNK
        if t1 > L:
            t1 = L
        for t in tl.range(i_c * CHUNK, t1, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):
            b_u, b_dt, b_B, b_C = _ss_load_step(
                p_u, p_dt, p_B, p_C, t, 0, 0, m0, M, N, BM, N_PAD, U_FMT, DT_FMT, B_FMT, C_FMT, False
            )
            b_h = tl.exp2(b_dt[None, :] * b_A2) * b_h + (b_dt * b_u)[None, :] * b_B[:, None]
            b_y = tl.sum(b_C[:, None] * b_h, axis=0) + b_D * b_u  # [BM]
            store_reduced_row(p_y + t * M, b_y, o_m, o_n, m_m, N_PAD, BM, False)
    if i_seg == n_seg - 1:
        tl.store(h_out_ptr + i_b * M * N + o_nm, b_h, mask=m_nm)


@triton.jit
def _ss_fwd_summary_kernel(
    u_ptr, dt_ptr, A_ptr, B_ptr, sum_ptr,
    L, M, N, seg_steps,
    BM: tl.constexpr, N_PAD: tl.constexpr, NUM_STAGES: tl.constexpr, UNROLL: tl.constexpr,
    U_FMT: tl.constexpr, DT_FMT: tl.constexpr, B_FMT: tl.constexpr,
):  # fmt: skip
    """The map h_end = G·h_start + H of segment i_seg (every segment but the last), [B, n_seg, 2, N, M]."""
    i_b, i_seg = tl.program_id(0).to(tl.int64), tl.program_id(2)
    n_seg = tl.num_programs(2) + 1
    m0 = tl.program_id(1) * BM
    o_m = m0 + tl.arange(0, BM)  # [BM]
    o_n = tl.arange(0, N_PAD)  # [N_PAD]
    m_nm = (o_n < N)[:, None] & (o_m < M)[None, :]  # [N_PAD, BM]
    o_nm = o_n[:, None] * M + o_m[None, :]  # [N_PAD, BM] into [N, M]
    b_A2 = tl.load(A_ptr + o_nm, mask=m_nm, other=0.0).to(tl.float32) * LOG2E
    b_G = tl.full([N_PAD, BM], 1.0, tl.float32)
    b_H = tl.zeros([N_PAD, BM], tl.float32)
    p_u, p_dt = row_start(u_ptr, i_b * L, M, U_FMT), row_start(dt_ptr, i_b * L, M, DT_FMT)
    p_B = row_start(B_ptr, i_b * L, N, B_FMT)
    for t in tl.range(i_seg * seg_steps, (i_seg + 1) * seg_steps, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):
        b_u, b_dt, b_B, _ = _ss_load_step(
            p_u, p_dt, p_B, p_B, t, 0, 0, m0, M, N, BM, N_PAD, U_FMT, DT_FMT, B_FMT, B_FMT, False
        )
        b_decay = tl.exp2(b_dt[None, :] * b_A2)
        b_G = b_decay * b_G
        b_H = b_decay * b_H + (b_dt * b_u)[None, :] * b_B[:, None]
    o_sum = (i_b * n_seg + i_seg) * PAIR * N * M + o_nm
    tl.store(sum_ptr + o_sum, b_G, mask=m_nm)
    tl.store(sum_ptr + o_sum + N * M, b_H, mask=m_nm)


@triton.jit
def _ss_carry_kernel(
    sum_ptr, init_ptr, out_ptr,
    M, N, n_seg,
    BM: tl.constexpr, N_PAD: tl.constexpr, HAS_INIT: tl.constexpr, REVERSE: tl.constexpr,
):  # fmt: skip
    """Chains segment maps x ← P·x + R (pairs (P, R) in sum_ptr [B, n_seg, 2, N, M]) from `init` [B, N, M] (or 0)
    and writes x at every segment, [B, n_seg, N, M]. Forwards: the state entering segment i (maps of segments
    0..i-1). REVERSE: the adjoint reaching segment i's last state (maps of segments n_seg-1..i+1)."""
    i_b = tl.program_id(0).to(tl.int64)
    o_m = tl.program_id(1) * BM + tl.arange(0, BM)  # [BM]
    o_n = tl.arange(0, N_PAD)  # [N_PAD]
    m_nm = (o_n < N)[:, None] & (o_m < M)[None, :]  # [N_PAD, BM]
    o_nm = o_n[:, None] * M + o_m[None, :]  # [N_PAD, BM] into [N, M]
    if HAS_INIT:
        b_x = tl.load(init_ptr + i_b * M * N + o_nm, mask=m_nm, other=0.0).to(tl.float32)
    else:
        b_x = tl.zeros([N_PAD, BM], tl.float32)
    for j in range(n_seg):
        i_seg = j
        if REVERSE:
            i_seg = n_seg - 1 - j
        tl.store(out_ptr + (i_b * n_seg + i_seg) * M * N + o_nm, b_x, mask=m_nm)
        if j < n_seg - 1:  # through segment i_seg's map (the next segment's start, or the previous one's end)
            p_sum = sum_ptr + (i_b * n_seg + i_seg) * PAIR * N * M + o_nm
            b_x = tl.load(p_sum, mask=m_nm, other=0.0) * b_x + tl.load(p_sum + N * M, mask=m_nm, other=0.0)


@triton.jit
def _ss_bwd_summary_kernel(
    u_ptr, dt_ptr, A_ptr, C_ptr, gy_ptr, sum_ptr,
    L, M, N, seg_steps,
    BM: tl.constexpr, N_PAD: tl.constexpr, NUM_STAGES: tl.constexpr, UNROLL: tl.constexpr,
    U_FMT: tl.constexpr, DT_FMT: tl.constexpr, C_FMT: tl.constexpr, GY_FMT: tl.constexpr,
):  # fmt: skip
    """The reverse map of segment i_seg (every segment but the first): Q = Π decay and Σ Q_t·C_t·gy_t."""
    i_b, i_seg = tl.program_id(0).to(tl.int64), tl.program_id(2) + 1
    n_seg = tl.num_programs(2) + 1
    m0 = tl.program_id(1) * BM
    o_m = m0 + tl.arange(0, BM)  # [BM]
    o_n = tl.arange(0, N_PAD)  # [N_PAD]
    m_nm = (o_n < N)[:, None] & (o_m < M)[None, :]  # [N_PAD, BM]
    o_nm = o_n[:, None] * M + o_m[None, :]  # [N_PAD, BM] into [N, M]
    b_A2 = tl.load(A_ptr + o_nm, mask=m_nm, other=0.0).to(tl.float32) * LOG2E
    b_Q = tl.full([N_PAD, BM], 1.0, tl.float32)
    b_S = tl.zeros([N_PAD, BM], tl.float32)
    t1 = (i_seg + 1) * seg_steps
    if t1 > L:
        t1 = L
    for t in tl.range(i_seg * seg_steps, t1, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):
        row_m, row_n = (i_b * L + t) * M, (i_b * L + t) * N
        _, b_dt, b_C, _ = _ss_load_step(
            u_ptr, dt_ptr, C_ptr, C_ptr, 0, row_m, row_n, m0, M, N, BM, N_PAD, U_FMT, DT_FMT, C_FMT, C_FMT, False
        )
        b_gy = load_row(gy_ptr, row_m + m0, row_m + M, BM, GY_FMT)
        b_Q = tl.exp2(b_dt[None, :] * b_A2) * b_Q
        b_S += b_Q * (b_C[:, None] * b_gy[None, :])
    o_sum = (i_b * n_seg + i_seg) * PAIR * N * M + o_nm
    tl.store(sum_ptr + o_sum, b_Q, mask=m_nm)
    tl.store(sum_ptr + o_sum + N * M, b_S, mask=m_nm)


@triton.jit
def _ss_bwd_inputs(
    u_ptr, dt_ptr, B_ptr, C_ptr, gy_ptr, row_m, row_n, m0, M, N, b_A2, b_hm,
    BM: tl.constexpr, N_PAD: tl.constexpr,
    U_FMT: tl.constexpr, DT_FMT: tl.constexpr, B_FMT: tl.constexpr, C_FMT: tl.constexpr, GY_FMT: tl.constexpr,
):  # fmt: skip
    """Step t's rows (at row_m = (b·L + t)·M, row_n = (b·L + t)·N), its decay exp(Δ·A), Δ·u, and the state after
    it from the state before it, b_hm: (u, Δ, B, C, gy, decay, Δ·u, h)."""
    b_u, b_dt, b_B, b_C = _ss_load_step(
        u_ptr, dt_ptr, B_ptr, C_ptr, 0, row_m, row_n, m0, M, N, BM, N_PAD, U_FMT, DT_FMT, B_FMT, C_FMT, True
    )
    b_gy = load_row(gy_ptr, row_m + m0, row_m + M, BM, GY_FMT)
    b_decay = tl.exp2(b_dt[None, :] * b_A2)  # [N_PAD, BM]
    b_du_dt = b_dt * b_u  # [BM]
    b_h = b_decay * b_hm + b_du_dt[None, :] * b_B[:, None]
    return b_u, b_dt, b_B, b_C, b_gy, b_decay, b_du_dt, b_h


@triton.jit
def _ss_bwd_step(
    b_gh, b_dA, b_dD, b_hm, b_h, b_u, b_dt, b_B, b_C, b_gy, b_decay, b_du_dt, b_A, b_D,
    p_du, p_ddt, p_dB, p_dC, o_tm, o_tn, o_m, o_n, m_m, m_n, BM: tl.constexpr, N_PAD: tl.constexpr,
):  # fmt: skip
    """The reverse step through step t (its inputs from `_ss_bwd_inputs`): stores du, dΔ and the dB, dC rows at
    o_tm = t·M, o_tn = t·N from this program's output rows; returns the adjoint of the state before the step and
    the running dA, dD."""
    b_gh += b_C[:, None] * b_gy[None, :]
    b_g_decay = b_gh * b_hm * b_decay  # d/d(Δ·A) of exp(Δ·A)
    b_g_dudt = tl.sum(b_gh * b_B[:, None], axis=0)  # [BM]
    b_ddt = tl.sum(b_g_decay * b_A, axis=0) + b_g_dudt * b_u
    b_du = b_g_dudt * b_dt + b_gy * b_D
    b_dA += b_g_decay * b_dt[None, :]
    b_dD += (b_gy * b_u)[None, :]
    b_dC = tl.sum(b_h * b_gy[None, :], axis=1)  # [N_PAD]
    b_dB = tl.sum(b_gh * b_du_dt[None, :], axis=1)  # [N_PAD]
    store_reduced_row(p_du + o_tm, b_du, o_m, o_n, m_m, N_PAD, BM, False)
    store_reduced_row(p_ddt + o_tm, b_ddt, o_m, o_n, m_m, N_PAD, BM, False)
    tl.store(p_dB + o_tn + o_n, b_dB, mask=m_n)
    tl.store(p_dC + o_tn + o_n, b_dC, mask=m_n)
    return b_gh * b_decay, b_dA, b_dD


@triton.jit
def _ss_bwd_kernel(
    u_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, ckpt_ptr, gy_ptr, gh_ptr, carry_ptr,
    du_ptr, ddt_ptr, dA_ptr, dB_ptr, dC_ptr, dD_ptr, dh0_ptr, scr_ptr,
    L, M, N, n_chunks, seg_chunks,
    BM: tl.constexpr, N_PAD: tl.constexpr, CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr, PAIR_UNROLL: tl.constexpr,
    HAS_D: tl.constexpr, HAS_INIT: tl.constexpr, HAS_GSTATE: tl.constexpr, HAS_CARRY: tl.constexpr,
    U_FMT: tl.constexpr, DT_FMT: tl.constexpr, B_FMT: tl.constexpr, C_FMT: tl.constexpr, GY_FMT: tl.constexpr,
):  # fmt: skip
    """Half scratch: the recomputation keeps the state before every other step of a chunk; walking back, each pair
    of steps recomputes the state between them from it, as the reverse step itself does for the state after its
    step (so the pair's second state costs no extra exp)."""
    i_b, i_mb, i_seg = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    n_mb, n_seg = tl.num_programs(1), tl.num_programs(2)
    m0 = i_mb * BM
    o_m = m0 + tl.arange(0, BM)  # [BM]
    o_n = tl.arange(0, N_PAD)  # [N_PAD]
    m_m, m_n = o_m < M, o_n < N
    m_nm = m_n[:, None] & m_m[None, :]  # [N_PAD, BM]
    o_nm = o_n[:, None] * M + o_m[None, :]  # [N_PAD, BM] into [N, M]
    b_A = tl.load(A_ptr + o_nm, mask=m_nm, other=0.0).to(tl.float32)
    b_A2 = b_A * LOG2E
    b_D = tl.load(D_ptr + o_m, mask=m_m, other=0.0).to(tl.float32) if HAS_D else tl.zeros([BM], tl.float32)
    if HAS_CARRY:  # time segments: what the later segments (and the final state) pass back to this one's end
        b_gh = tl.load(carry_ptr + (i_b * n_seg + i_seg) * M * N + o_nm, mask=m_nm, other=0.0)
    elif HAS_GSTATE:
        b_gh = tl.load(gh_ptr + i_b * M * N + o_nm, mask=m_nm, other=0.0).to(tl.float32)
    else:
        b_gh = tl.zeros([N_PAD, BM], tl.float32)
    b_dA = tl.zeros([N_PAD, BM], tl.float32)
    # dD as an [N_PAD, BM] sum whose rows are all the same (row 0 is stored): a [BM] accumulator kept the layout of
    # one channel per lane, for which the loop read u and gy a second time (in bf16 also unpacking them and
    # exchanging the halves by shuffles); zeros (b_A reads 0 outside m_nm) taken from b_A keep b_A's layout
    b_dD = tl.where(m_nm, 0.0, b_A)
    o_ckpt = (i_b * n_chunks * N + o_n[:, None]) * M + o_m[None, :]  # [N_PAD, BM] into [B, NC, N, M]
    i_prog = (i_b * n_mb + i_mb) * n_seg + i_seg
    # the scratch and the outputs from this program's rows with int32 per-step offsets and masks fixed over t (the
    # loads keep the 64-bit offsets: see `_ss_load_step`)
    p_scr = scr_ptr + i_prog * ((CHUNK + 1) // 2) * N_PAD * BM
    o_scr = o_n[:, None] * BM + tl.arange(0, BM)[None, :]  # [N_PAD, BM] into one [N_PAD, BM] slot
    p_du, p_ddt = du_ptr + i_b * L * M, ddt_ptr + i_b * L * M
    p_dB = dB_ptr + (i_b * n_mb + i_mb) * L * N  # [B, NMB, L, N] at t = 0
    p_dC = dC_ptr + (i_b * n_mb + i_mb) * L * N
    c1 = (i_seg + 1) * seg_chunks
    if c1 > n_chunks:
        c1 = n_chunks
    for i_c in range(c1 - i_seg * seg_chunks):  # the segment's chunks, last first
        t0 = (c1 - 1 - i_c) * CHUNK
        t1 = t0 + CHUNK
        if t1 > L:
            t1 = L
        n_pairs = (t1 - t0) // 2
        b_h = tl.load(ckpt_ptr + o_ckpt + (t0 // CHUNK) * N * M, mask=m_nm, other=0.0)
        # recompute the chunk's states, keeping the state before every even step t0 + 2j in scratch slot j (and
        # before the last step of a chunk of odd length, the sequence's last, in slot n_pairs)
        for j in tl.range(0, n_pairs, num_stages=NUM_STAGES, loop_unroll_factor=PAIR_UNROLL):
            tl.store(p_scr + j * N_PAD * BM + o_scr, b_h)
            for s in tl.static_range(2):
                row_m, row_n = (i_b * L + t0 + 2 * j + s) * M, (i_b * L + t0 + 2 * j + s) * N
                b_u, b_dt, b_B, _ = _ss_load_step(
                    u_ptr, dt_ptr, B_ptr, B_ptr, 0, row_m, row_n, m0, M, N, BM, N_PAD, U_FMT, DT_FMT, B_FMT, B_FMT,
                    True,
                )  # fmt: skip
                b_h = tl.exp2(b_dt[None, :] * b_A2) * b_h + (b_dt * b_u)[None, :] * b_B[:, None]
        if (t1 - t0) % 2 == 1:
            tl.store(p_scr + n_pairs * N_PAD * BM + o_scr, b_h)
        tl.debug_barrier()
        if (t1 - t0) % 2 == 1:  # a chunk of odd length: its last step alone
            row_m, row_n = (i_b * L + t1 - 1) * M, (i_b * L + t1 - 1) * N
            b_hm = tl.load(p_scr + n_pairs * N_PAD * BM + o_scr)
            b_u, b_dt, b_B, b_C, b_gy, b_decay, b_du_dt, b_h = _ss_bwd_inputs(
                u_ptr, dt_ptr, B_ptr, C_ptr, gy_ptr, row_m, row_n, m0, M, N, b_A2, b_hm, BM, N_PAD,
                U_FMT, DT_FMT, B_FMT, C_FMT, GY_FMT,
            )  # fmt: skip
            b_gh, b_dA, b_dD = _ss_bwd_step(
                b_gh, b_dA, b_dD, b_hm, b_h, b_u, b_dt, b_B, b_C, b_gy, b_decay, b_du_dt, b_A, b_D,
                p_du, p_ddt, p_dB, p_dC, (t1 - 1) * M, (t1 - 1) * N, o_m, o_n, m_m, m_n, BM, N_PAD,
            )  # fmt: skip
        for j in tl.range(0, n_pairs, num_stages=NUM_STAGES, loop_unroll_factor=PAIR_UNROLL):  # pairs, last first
            i_pair = n_pairs - 1 - j
            t = t0 + 2 * i_pair  # the pair's first step
            b_hm = tl.load(p_scr + i_pair * N_PAD * BM + o_scr)  # the state before step t
            row_m, row_n = (i_b * L + t) * M, (i_b * L + t) * N
            b_u, b_dt, b_B, b_C, b_gy, b_decay, b_du_dt, b_h = _ss_bwd_inputs(
                u_ptr, dt_ptr, B_ptr, C_ptr, gy_ptr, row_m, row_n, m0, M, N, b_A2, b_hm, BM, N_PAD,
                U_FMT, DT_FMT, B_FMT, C_FMT, GY_FMT,
            )  # fmt: skip
            b_u2, b_dt2, b_B2, b_C2, b_gy2, b_decay2, b_du_dt2, b_h2 = _ss_bwd_inputs(
                u_ptr, dt_ptr, B_ptr, C_ptr, gy_ptr, row_m + M, row_n + N, m0, M, N, b_A2, b_h, BM, N_PAD,
                U_FMT, DT_FMT, B_FMT, C_FMT, GY_FMT,
            )  # fmt: skip
            b_gh, b_dA, b_dD = _ss_bwd_step(
                b_gh, b_dA, b_dD, b_h, b_h2, b_u2, b_dt2, b_B2, b_C2, b_gy2, b_decay2, b_du_dt2, b_A, b_D,
                p_du, p_ddt, p_dB, p_dC, (t + 1) * M, (t + 1) * N, o_m, o_n, m_m, m_n, BM, N_PAD,
            )  # fmt: skip
            b_gh, b_dA, b_dD = _ss_bwd_step(
                b_gh, b_dA, b_dD, b_hm, b_h, b_u, b_dt, b_B, b_C, b_gy, b_decay, b_du_dt, b_A, b_D,
                p_du, p_ddt, p_dB, p_dC, t * M, t * N, o_m, o_n, m_m, m_n, BM, N_PAD,
            )  # fmt: skip
        tl.debug_barrier()
    tl.store(dA_ptr + (i_b * n_seg + i_seg) * M * N + o_nm, b_dA, mask=m_nm)
    p_dD = dD_ptr + (i_b * n_seg + i_seg) * M + (o_m[None, :] + 0 * o_n[:, None])  # [N_PAD, BM]
    tl.store(p_dD, b_dD, mask=(o_n == 0)[:, None] & m_m[None, :])
    if HAS_INIT and i_seg == 0:
        tl.store(dh0_ptr + i_b * M * N + o_nm, b_gh, mask=m_nm)


def default_config(batch: int, length: int, channels: int, n_state: int) -> ScanConfig:
    """The launch parameters `selective_scan_triton` uses when none are given: SPLIT_CONFIG where the automatic
    time-parallel split cuts [B, L, M] inputs with N states into segments, DEFAULT_CONFIG where it walks L whole."""
    split = segment_chunks(batch, length, channels, n_state, DEFAULT_CONFIG) < triton.cdiv(length, DEFAULT_CONFIG.chunk)
    return SPLIT_CONFIG if split else DEFAULT_CONFIG


def _segments(u: Tensor, n_state: int, config: ScanConfig) -> tuple[int, int, int]:
    """(chunks, chunks per segment, segments) of the time-parallel split for inputs like u [B, L, M]."""
    batch, length, channels = u.shape
    n_chunks = triton.cdiv(length, config.chunk)
    seg_chunks = segment_chunks(batch, length, channels, n_state, config)
    return n_chunks, seg_chunks, triton.cdiv(n_chunks, seg_chunks)


def _chain(summary: Tensor, init: Tensor | None, reverse: bool, block_m: int, num_warps: int) -> Tensor:
    """`_ss_carry_kernel` over segment maps `summary` [B, n_seg, 2, N, M]: [B, n_seg, N, M] float32."""
    batch, n_seg, _, n_state, channels = summary.shape
    out = summary.new_empty(batch, n_seg, n_state, channels)
    _ss_carry_kernel[(batch, triton.cdiv(channels, block_m))](
        summary, init, out, channels, n_state, n_seg,
        BM=block_m, N_PAD=state_pad(n_state), HAS_INIT=init is not None, REVERSE=reverse, num_warps=num_warps,
    )  # fmt: skip
    return out


def _launch_fwd(u, delta, A, Bm, Cm, D, h0, config: ScanConfig, save_ckpt: bool):
    """Forward launches on contiguous inputs; returns y [B, L, M], h [B, M, N] float32, checkpoints or None."""
    batch, length, channels = u.shape
    n_state, n_pad = A.shape[-1], state_pad(A.shape[-1])
    n_chunks, seg_chunks, n_seg = _segments(u, n_state, config)
    n_mb = triton.cdiv(channels, config.block_m)
    y = torch.empty_like(u)
    h = u.new_empty(batch, n_state, channels, dtype=torch.float32)  # [B, N, M]: m contiguous in the kernel
    ckpt = u.new_empty(batch, n_chunks, n_state, channels, dtype=torch.float32) if save_ckpt else None
    A_t, h0_t = to_kernel_layout(A), to_kernel_layout(h0)
    (u_rows, u_fmt), (dt_rows, dt_fmt), (B_rows, B_fmt), (C_rows, C_fmt) = (as_rows(x) for x in (u, delta, Bm, Cm))
    launch = dict(BM=config.block_m, N_PAD=n_pad, NUM_STAGES=config.num_stages, UNROLL=config.unroll,
                  U_FMT=u_fmt, DT_FMT=dt_fmt, B_FMT=B_fmt, num_warps=config.num_warps)  # fmt: skip
    if n_seg > 1:
        summary = torch.empty(batch, n_seg, PAIR.value, n_state, channels, device=u.device, dtype=torch.float32)
        _ss_fwd_summary_kernel[(batch, n_mb, n_seg - 1)](
            u_rows,
            dt_rows,
            A_t,
            B_rows,
            summary,
            length,
            channels,
            n_state,
            seg_chunks * config.chunk,
            **(launch | {"UNROLL": SUMMARY_UNROLL}),
        )
        h0_t = _chain(summary, h0_t, False, config.block_m, config.num_warps)
    _ss_fwd_kernel[(batch, n_mb, n_seg)](
        u_rows, dt_rows, A_t, B_rows, C_rows, D, h0_t, y, h, ckpt,
        length, channels, n_state, n_chunks, seg_chunks, CHUNK=config.chunk,
        HAS_D=D is not None, HAS_INIT=h0_t is not None, SAVE_CKPT=save_ckpt, C_FMT=C_fmt, **launch,
    )  # fmt: skip
    return y, from_kernel_layout(h), ckpt


def _launch_bwd(saved, gy: Tensor, gh: Tensor | None, config: ScanConfig):
    """Backward launches; returns (du, ddelta, dA, dB, dC, dD, dh0) in the inputs' dtypes (None where absent)."""
    u, delta, A, Bm, Cm, D, h0, ckpt = saved
    batch, length, channels = u.shape
    n_state, n_pad = A.shape[-1], state_pad(A.shape[-1])
    n_chunks, seg_chunks, n_seg = _segments(u, n_state, config)
    n_mb = triton.cdiv(channels, config.bwd_block_m)
    f32 = dict(device=u.device, dtype=torch.float32)
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dB_part = torch.empty(batch, n_mb, length, n_state, **f32)
    dC_part = torch.empty_like(dB_part)
    dA_part = torch.empty(batch, n_seg, n_state, channels, **f32)  # [B, n_seg, N, M] (kernel layout)
    dD_part = torch.empty(batch, n_seg, channels, **f32)
    dh0 = torch.empty(batch, n_state, channels, **f32) if h0 is not None else None
    scratch = torch.empty(batch, n_mb, n_seg, (config.chunk + 1) // 2, n_pad, config.bwd_block_m, **f32)
    A_t, gh_t = to_kernel_layout(A), to_kernel_layout(gh)
    rows = [as_rows(x) for x in (u, delta, Bm, Cm, gy)]
    (u_rows, dt_rows, B_rows, C_rows, gy_rows), formats = zip(*rows)
    fmts = dict(zip(("U_FMT", "DT_FMT", "B_FMT", "C_FMT", "GY_FMT"), formats))
    launch = dict(BM=config.bwd_block_m, N_PAD=n_pad, NUM_STAGES=config.bwd_num_stages, UNROLL=config.bwd_unroll,
                  num_warps=config.bwd_num_warps)  # fmt: skip
    carry = None
    if n_seg > 1:
        summary = torch.empty(batch, n_seg, PAIR.value, n_state, channels, **f32)
        _ss_bwd_summary_kernel[(batch, n_mb, n_seg - 1)](
            u_rows, dt_rows, A_t, C_rows, gy_rows, summary, length, channels, n_state, seg_chunks * config.chunk,
            **{k: v for k, v in fmts.items() if k != "B_FMT"}, **(launch | {"UNROLL": SUMMARY_UNROLL}),
        )  # fmt: skip
        carry = _chain(summary, gh_t, True, config.bwd_block_m, config.bwd_num_warps)
    _ss_bwd_kernel[(batch, n_mb, n_seg)](
        u_rows, dt_rows, A_t, B_rows, C_rows, D, ckpt, gy_rows, gh_t, carry,
        du, ddelta, dA_part, dB_part, dC_part, dD_part, dh0, scratch,
        length, channels, n_state, n_chunks, seg_chunks, CHUNK=config.chunk,
        HAS_D=D is not None, HAS_INIT=h0 is not None, HAS_GSTATE=gh is not None, HAS_CARRY=carry is not None,
        PAIR_UNROLL=pair_unroll(config.bwd_unroll), **fmts, **{k: v for k, v in launch.items() if k != "UNROLL"},
    )  # fmt: skip
    dA = from_kernel_layout(dA_part.sum((0, 1))).to(A.dtype)
    dD = dD_part.sum((0, 1)).to(D.dtype) if D is not None else None
    dh0 = from_kernel_layout(dh0).to(h0.dtype) if h0 is not None else None
    return du, ddelta, dA, dB_part.sum(1).to(Bm.dtype), dC_part.sum(1).to(Cm.dtype), dD, dh0


@torch.library.custom_op("klalm::selective_scan_fwd", mutates_args=())
def selective_scan_fwd_op(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    D: Tensor | None,
    h0: Tensor | None,
    config: list[int],
    save_ckpt: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, h, ckpt) of `_launch_fwd` on contiguous inputs; ckpt is empty without `save_ckpt`."""
    y, h, ckpt = _launch_fwd(u, delta, A, Bm, Cm, D, h0, ScanConfig(*config), save_ckpt)
    return y, h, u.new_empty(0, dtype=torch.float32) if ckpt is None else ckpt


@selective_scan_fwd_op.register_fake
def _(u, delta, A, Bm, Cm, D, h0, config, save_ckpt):
    batch, length, channels = u.shape
    n_state, n_chunks = A.shape[-1], triton.cdiv(length, ScanConfig(*config).chunk)
    ckpt_shape = (batch, n_chunks, n_state, channels) if save_ckpt else (0,)
    h = u.new_empty(batch, channels, n_state, dtype=torch.float32)
    return torch.empty_like(u), h, u.new_empty(ckpt_shape, dtype=torch.float32)


@torch.library.custom_op("klalm::selective_scan_bwd", mutates_args=())
def selective_scan_bwd_op(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    D: Tensor | None,
    h0: Tensor | None,
    ckpt: Tensor,
    gy: Tensor,
    gh: Tensor | None,
    config: list[int],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(du, ddelta, dA, dB, dC, dD, dh0) of `_launch_bwd`; dD, dh0 are empty when D, h0 are None; a None gh means
    the final state was unused."""
    grads = _launch_bwd((u, delta, A, Bm, Cm, D, h0, ckpt), gy, gh, ScanConfig(*config))
    return *grads[:5], *(u.new_empty(0, dtype=torch.float32) if g is None else g for g in grads[5:])


@selective_scan_bwd_op.register_fake
def _(u, delta, A, Bm, Cm, D, h0, *rest):
    optional = [u.new_empty(0, dtype=torch.float32) if x is None else torch.empty_like(x) for x in (D, h0)]
    return (*(torch.empty_like(x) for x in (u, delta, A, Bm, Cm)), *optional)


def _setup_context(ctx, inputs, output):
    u, delta, A, Bm, Cm, D, h0, config, _ = inputs
    ctx.save_for_backward(u, delta, A, Bm, Cm, D, h0, output[2])
    ctx.config = config
    ctx.mark_non_differentiable(output[2])
    ctx.set_materialize_grads(False)  # an unused final state arrives as None and its terms are skipped


def _backward(ctx, gy, gh, _gckpt):
    saved = ctx.saved_tensors
    gy = torch.zeros_like(saved[0]) if gy is None else gy.contiguous()
    gh = None if gh is None else gh.contiguous()
    grads = selective_scan_bwd_op(*saved, gy, gh, ctx.config)
    optional = [None if x is None else g for x, g in zip(saved[5:7], grads[5:])]
    return (*grads[:5], *optional, None, None)


selective_scan_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def _check_shapes(u, delta, A, Bm, Cm, D, initial_state) -> None:
    """Raise ValueError naming the first tensor whose shape does not fit u [B, L, M] and A [M, N]."""
    if u.dim() != 3 or A.dim() != 2:
        raise ValueError(f"u must be [B, L, M] and A [M, N]; got u {tuple(u.shape)}, A {tuple(A.shape)}")
    (batch, length, channels), n_state = u.shape, A.shape[-1]
    expected = {"delta": (delta, (batch, length, channels)), "A": (A, (channels, n_state)),
                "Bm": (Bm, (batch, length, n_state)), "Cm": (Cm, (batch, length, n_state))}  # fmt: skip
    if D is not None:
        expected["D"] = (D, (channels,))
    if initial_state is not None:
        expected["initial_state"] = (initial_state, (batch, channels, n_state))
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {shape}")
    if not 1 <= n_state <= MAX_STATE_SIZE:
        raise ValueError(f"state size N={n_state} must be in [1, {MAX_STATE_SIZE}]")


def selective_scan_triton(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
    config: ScanConfig | None = None,
) -> tuple[Tensor, Tensor]:
    """Selective scan with the fused Triton kernels (differentiable in every tensor).

    Args:
        u: input, [B, L, M]; float16/bfloat16/float32, computed in float32.
        delta: step sizes Δ (already positive, e.g. after softplus), [B, L, M].
        A: state matrix (negative), [M, N], N ≤ 64.
        Bm, Cm: input-dependent input and output maps, [B, L, N].
        D: skip weights, [M], or None.
        initial_state: h0, [B, M, N], or None for zeros.
        config: launch parameters (`default_config` of the shapes when None; its `segment` picks the time-parallel
            split).
    Returns:
        y [B, L, M] in u's dtype and the final state h [B, M, N] in float32, as the reference.
    """
    _check_shapes(u, delta, A, Bm, Cm, D, initial_state)
    named = {"u": u, "delta": delta, "A": A, "Bm": Bm, "Cm": Cm, "D": D, "initial_state": initial_state}
    check_kernel_device({name: t for name, t in named.items() if t is not None})
    check_offsets(u.shape[1], u.shape[2], A.shape[-1])
    if u.shape[1] == 0:
        h = u.new_zeros(u.shape[0], u.shape[2], A.shape[-1], dtype=torch.float32)
        return u.clone(), h if initial_state is None else initial_state.float()
    config = config or default_config(*u.shape, A.shape[-1])
    check_config(config)
    if config.state_slice:
        raise ValueError(f"ScanConfig.state_slice={config.state_slice}: the selective scan has no sliced path (use 0)")
    args = [x.contiguous() if x is not None else None for x in (u, delta, A, Bm, Cm, D, initial_state)]
    save_ckpt = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args)
    y, h, _ = selective_scan_fwd_op(*args, list(config), save_ckpt)
    return y, h
