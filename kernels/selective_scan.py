"""`selective_scan_triton`: fused Triton forward and backward of Mamba-1's selective scan (backend "triton").

Oracle: `klalm.ops.selective_scan.selective_scan_reference` (same arguments and results):

    h_t = exp(Δ_t·A) ⊙ h_{t-1} + (Δ_t·u_t) ⊗ B_t        y_t = h_t · C_t + D ⊙ u_t

The machinery is the KLA scan's (mobius_scan_fwd.py; shared helpers in common.py): one program per batch row
and BM channels, the [N_PAD, BM] state in registers, time walked in order with the loads pipelined, the state saved
every CHUNK steps. The backward recomputes each chunk's states into a per-program scratch buffer and
runs the reverse recursion gh_{t-1} = exp(Δ_t·A)·gh_t, with gh_t += gy_t·C_t at each step; dB and dC
(sums over m) leave one [N] row per (program, t) in a [B, M/BM, L, N] buffer, dA and dD are summed
over t in registers; the caller finishes those sums. No atomics: results are deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from klalm.kernels.common import (
    ScanConfig,
    check_config,
    check_kernel_device,
    check_offsets,
    from_kernel_layout,
    to_kernel_layout,
)

MAX_STATE_SIZE = 64
DEFAULT_CONFIG = ScanConfig(  # fastest fwd and fwd+bwd measured on an H200 (kernels/NOTES.md)
    block_m=16, chunk=64, num_warps=1, num_stages=3, unroll=4,
    bwd_block_m=8, bwd_num_warps=1, bwd_num_stages=3, bwd_unroll=4,
)  # fmt: skip


@triton.jit
def _ss_load_step(p_u, p_dt, p_B, p_C, m_m, m_n):
    """One step's u, Δ [BM] and B, C [N_PAD] as float32 (padding reads 0)."""
    b_u = tl.load(p_u, mask=m_m, other=0.0).to(tl.float32)
    b_dt = tl.load(p_dt, mask=m_m, other=0.0).to(tl.float32)
    b_B = tl.load(p_B, mask=m_n, other=0.0).to(tl.float32)
    b_C = tl.load(p_C, mask=m_n, other=0.0).to(tl.float32)
    return b_u, b_dt, b_B, b_C


@triton.jit
def _ss_fwd_kernel(
    u_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, h0_ptr, y_ptr, h_out_ptr, ckpt_ptr,
    L, M, N, n_chunks,
    BM: tl.constexpr, N_PAD: tl.constexpr, CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr, UNROLL: tl.constexpr,
    HAS_D: tl.constexpr, HAS_INIT: tl.constexpr, SAVE_CKPT: tl.constexpr,
):  # fmt: skip
    i_b = tl.program_id(0).to(tl.int64)
    o_m = tl.program_id(1) * BM + tl.arange(0, BM)  # [BM]
    o_n = tl.arange(0, N_PAD)  # [N_PAD]
    m_m, m_n = o_m < M, o_n < N
    m_nm = m_n[:, None] & m_m[None, :]  # [N_PAD, BM]
    o_nm = o_n[:, None] * M + o_m[None, :]  # [N_PAD, BM] into [N, M]
    b_A2 = tl.load(A_ptr + o_nm, mask=m_nm, other=0.0).to(tl.float32) * 1.4426950408889634  # A·log2 e
    b_D = tl.load(D_ptr + o_m, mask=m_m, other=0.0).to(tl.float32) if HAS_D else tl.zeros([BM], tl.float32)
    if HAS_INIT:
        b_h = tl.load(h0_ptr + i_b * M * N + o_nm, mask=m_nm, other=0.0).to(tl.float32)
    else:
        b_h = tl.zeros([N_PAD, BM], tl.float32)
    o_ckpt = (i_b * n_chunks * N + o_n[:, None]) * M + o_m[None, :]  # [N_PAD, BM] into [B, NC, N, M]
    o_bm, o_bn = i_b * L * M + o_m, i_b * L * N + o_n  # [BM], [N_PAD] at t = 0
    for i_c in range(n_chunks):
        if SAVE_CKPT:
            tl.store(ckpt_ptr + o_ckpt + i_c * N * M, b_h, mask=m_nm)
        t1 = (i_c + 1) * CHUNK
        if t1 > L:
            t1 = L
        for t in tl.range(i_c * CHUNK, t1, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):
            o_tm, o_tn = o_bm + t * M, o_bn + t * N
            b_u, b_dt, b_B, b_C = _ss_load_step(u_ptr + o_tm, dt_ptr + o_tm, B_ptr + o_tn, C_ptr + o_tn, m_m, m_n)
            b_h = tl.exp2(b_dt[None, :] * b_A2) * b_h + (b_dt * b_u)[None, :] * b_B[:, None]
            b_y = tl.sum(b_C[:, None] * b_h, axis=0) + b_D * b_u  # [BM]
            tl.store(y_ptr + o_tm, b_y.to(y_ptr.dtype.element_ty), mask=m_m)
    tl.store(h_out_ptr + i_b * M * N + o_nm, b_h, mask=m_nm)


@triton.jit
def _ss_bwd_kernel(
    u_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, ckpt_ptr, gy_ptr, gh_ptr,
    du_ptr, ddt_ptr, dA_ptr, dB_ptr, dC_ptr, dD_ptr, dh0_ptr, scr_ptr,
    L, M, N, n_chunks,
    BM: tl.constexpr, N_PAD: tl.constexpr, CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr, UNROLL: tl.constexpr,
    HAS_D: tl.constexpr, HAS_INIT: tl.constexpr, HAS_GSTATE: tl.constexpr,
):  # fmt: skip
    i_b, i_mb = tl.program_id(0).to(tl.int64), tl.program_id(1)
    n_mb = tl.num_programs(1)
    o_m = i_mb * BM + tl.arange(0, BM)  # [BM]
    o_n = tl.arange(0, N_PAD)  # [N_PAD]
    m_m, m_n = o_m < M, o_n < N
    m_nm = m_n[:, None] & m_m[None, :]  # [N_PAD, BM]
    o_nm = o_n[:, None] * M + o_m[None, :]  # [N_PAD, BM] into [N, M]
    b_A = tl.load(A_ptr + o_nm, mask=m_nm, other=0.0).to(tl.float32)
    b_A2 = b_A * 1.4426950408889634
    b_D = tl.load(D_ptr + o_m, mask=m_m, other=0.0).to(tl.float32) if HAS_D else tl.zeros([BM], tl.float32)
    b_gh = tl.zeros([N_PAD, BM], tl.float32)
    if HAS_GSTATE:
        b_gh = tl.load(gh_ptr + i_b * M * N + o_nm, mask=m_nm, other=0.0).to(tl.float32)
    b_dA = tl.zeros([N_PAD, BM], tl.float32)
    b_dD = tl.zeros([BM], tl.float32)
    o_ckpt = (i_b * n_chunks * N + o_n[:, None]) * M + o_m[None, :]  # [N_PAD, BM] into [B, NC, N, M]
    o_scr = ((i_b * n_mb + i_mb) * CHUNK * N_PAD + o_n[:, None]) * BM + tl.arange(0, BM)[None, :]  # [N_PAD, BM]
    o_part = (i_b * n_mb + i_mb) * L * N + o_n  # [N_PAD] into [B, NMB, L, N] at t = 0
    o_bm, o_bn = i_b * L * M + o_m, i_b * L * N + o_n  # [BM], [N_PAD] at t = 0
    for i_c in range(n_chunks):
        t0 = (n_chunks - 1 - i_c) * CHUNK
        t1 = t0 + CHUNK
        if t1 > L:
            t1 = L
        b_h = tl.load(ckpt_ptr + o_ckpt + (t0 // CHUNK) * N * M, mask=m_nm, other=0.0)
        for t in tl.range(t0, t1, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):  # recompute the chunk's states
            tl.store(scr_ptr + o_scr + (t - t0) * N_PAD * BM, b_h)
            o_tm, o_tn = o_bm + t * M, o_bn + t * N
            b_u, b_dt, b_B, _ = _ss_load_step(u_ptr + o_tm, dt_ptr + o_tm, B_ptr + o_tn, B_ptr + o_tn, m_m, m_n)
            b_h = tl.exp2(b_dt[None, :] * b_A2) * b_h + (b_dt * b_u)[None, :] * b_B[:, None]
        tl.debug_barrier()
        for j in tl.range(
            0, t1 - t0, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL
        ):  # reverse recursion over the chunk
            t = t1 - 1 - j
            b_hm = tl.load(scr_ptr + o_scr + (t - t0) * N_PAD * BM)  # h_{t-1}
            o_tm, o_tn = o_bm + t * M, o_bn + t * N
            b_u, b_dt, b_B, b_C = _ss_load_step(u_ptr + o_tm, dt_ptr + o_tm, B_ptr + o_tn, C_ptr + o_tn, m_m, m_n)
            b_gy = tl.load(gy_ptr + o_tm, mask=m_m, other=0.0).to(tl.float32)
            b_decay = tl.exp2(b_dt[None, :] * b_A2)  # [N_PAD, BM]
            b_du_dt = b_dt * b_u  # [BM]
            b_h = b_decay * b_hm + b_du_dt[None, :] * b_B[:, None]
            b_gh += b_C[:, None] * b_gy[None, :]
            b_g_decay = b_gh * b_hm * b_decay  # d/d(Δ·A) of exp(Δ·A)
            b_g_dudt = tl.sum(b_gh * b_B[:, None], axis=0)  # [BM]
            b_ddt = tl.sum(b_g_decay * b_A, axis=0) + b_g_dudt * b_u
            b_du = b_g_dudt * b_dt + b_gy * b_D
            b_dA += b_g_decay * b_dt[None, :]
            b_dD += b_gy * b_u
            b_dC = tl.sum(b_h * b_gy[None, :], axis=1)  # [N_PAD]
            b_dB = tl.sum(b_gh * b_du_dt[None, :], axis=1)  # [N_PAD]
            b_gh = b_gh * b_decay
            tl.store(du_ptr + o_tm, b_du.to(du_ptr.dtype.element_ty), mask=m_m)
            tl.store(ddt_ptr + o_tm, b_ddt.to(ddt_ptr.dtype.element_ty), mask=m_m)
            tl.store(dB_ptr + o_part + t * N, b_dB, mask=m_n)
            tl.store(dC_ptr + o_part + t * N, b_dC, mask=m_n)
        tl.debug_barrier()
    tl.store(dA_ptr + i_b * M * N + o_nm, b_dA, mask=m_nm)
    tl.store(dD_ptr + i_b * M + o_m, b_dD, mask=m_m)
    if HAS_INIT:
        tl.store(dh0_ptr + i_b * M * N + o_nm, b_gh, mask=m_nm)


def _launch_fwd(u, delta, A, Bm, Cm, D, h0, config: ScanConfig, save_ckpt: bool):
    """Forward launch on contiguous inputs; returns y [B, L, M], h [B, M, N] float32, checkpoints or None."""
    batch, length, channels = u.shape
    n_state = A.shape[-1]
    n_chunks = triton.cdiv(length, config.chunk)
    y = torch.empty_like(u)
    h = u.new_empty(batch, n_state, channels, dtype=torch.float32)  # [B, N, M]: m contiguous in the kernel
    ckpt = u.new_empty(batch, n_chunks, n_state, channels, dtype=torch.float32) if save_ckpt else None
    _ss_fwd_kernel[(batch, triton.cdiv(channels, config.block_m))](
        u, delta, to_kernel_layout(A), Bm, Cm, D, to_kernel_layout(h0), y, h, ckpt,
        length, channels, n_state, n_chunks,
        BM=config.block_m, N_PAD=triton.next_power_of_2(n_state), CHUNK=config.chunk, NUM_STAGES=config.num_stages,
        UNROLL=config.unroll,
        HAS_D=D is not None, HAS_INIT=h0 is not None, SAVE_CKPT=save_ckpt, num_warps=config.num_warps,
    )  # fmt: skip
    return y, from_kernel_layout(h), ckpt


def _launch_bwd(saved, gy: Tensor, gh: Tensor | None, config: ScanConfig):
    """Backward launch; returns (du, ddelta, dA, dB, dC, dD, dh0) in the inputs' dtypes (None where absent)."""
    u, delta, A, Bm, Cm, D, h0, ckpt = saved
    batch, length, channels = u.shape
    n_state, n_pad = A.shape[-1], triton.next_power_of_2(A.shape[-1])
    n_mb = triton.cdiv(channels, config.bwd_block_m)
    f32 = dict(device=u.device, dtype=torch.float32)
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dB_part = torch.empty(batch, n_mb, length, n_state, **f32)
    dC_part = torch.empty_like(dB_part)
    dA_part = torch.empty(batch, n_state, channels, **f32)  # [B, N, M] (kernel layout)
    dD_part = torch.empty(batch, channels, **f32)
    dh0 = torch.empty(batch, n_state, channels, **f32) if h0 is not None else None
    scratch = torch.empty(batch, n_mb, config.chunk, n_pad, config.bwd_block_m, **f32)
    _ss_bwd_kernel[(batch, n_mb)](
        u, delta, to_kernel_layout(A), Bm, Cm, D, ckpt, gy, to_kernel_layout(gh),
        du, ddelta, dA_part, dB_part, dC_part, dD_part, dh0, scratch,
        length, channels, n_state, ckpt.shape[1],
        BM=config.bwd_block_m, N_PAD=n_pad, CHUNK=config.chunk, NUM_STAGES=config.bwd_num_stages,
        UNROLL=config.bwd_unroll,
        HAS_D=D is not None, HAS_INIT=h0 is not None, HAS_GSTATE=gh is not None, num_warps=config.bwd_num_warps,
    )  # fmt: skip
    dA = from_kernel_layout(dA_part.sum(0)).to(A.dtype)
    dD = dD_part.sum(0).to(D.dtype) if D is not None else None
    dh0 = from_kernel_layout(dh0).to(h0.dtype) if h0 is not None else None
    return du, ddelta, dA, dB_part.sum(1).to(Bm.dtype), dC_part.sum(1).to(Cm.dtype), dD, dh0


class _SelectiveScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, delta, A, Bm, Cm, D, h0, config: ScanConfig):
        y, h, ckpt = _launch_fwd(u, delta, A, Bm, Cm, D, h0, config, save_ckpt=any(ctx.needs_input_grad))
        ctx.save_for_backward(u, delta, A, Bm, Cm, D, h0, ckpt)
        ctx.config = config
        ctx.set_materialize_grads(False)  # an unused final state arrives as None and its terms are skipped
        return y, h

    @staticmethod
    @once_differentiable
    def backward(ctx, gy, gh):
        saved = ctx.saved_tensors
        gy = torch.zeros_like(saved[0]) if gy is None else gy.contiguous()
        gh = None if gh is None else gh.contiguous()
        return (*_launch_bwd(saved, gy, gh, ctx.config), None)


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
        config: launch parameters (`DEFAULT_CONFIG` when None).
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
    config = config or DEFAULT_CONFIG
    check_config(config)
    args = [x.contiguous() if x is not None else None for x in (u, delta, A, Bm, Cm, D, initial_state)]
    return _SelectiveScan.apply(*args, config)
