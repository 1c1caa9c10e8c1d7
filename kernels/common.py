"""What the Triton scans share (mobius_scan_*.py for KLA, selective_scan.py for Mamba): the launch configuration,
the time-parallel split, the device/dtype/size checks, the state layout, and the `@triton.jit` helpers (reciprocal,
row loads that read 16-bit inputs in pairs).

Nothing here knows a filter's math; each scan's kernels and their oracle live in their own files.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1), where inline PTX is unavailable."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class ScanConfig(NamedTuple):
    """Launch parameters of a scan's forward and backward kernels (defaults: fastest KLA forward+backward measured
    on an H200, kernels/NOTES.md).

    block_m, bwd_block_m: channels per program (BM, a power of two) in the forward and the backward;
    chunk: steps between saved states (the backward recomputes one chunk at a time);
    num_warps, num_stages / bwd_num_warps, bwd_num_stages: Triton launch options of the forward / backward
    (stages of the load pipeline);
    unroll / bwd_unroll: time steps per unrolled loop body (lets the scheduler overlap independent work of
    several steps; the KLA backward takes its steps in pairs, so there bwd_unroll 1 and 2 are the same kernel);
    segment: steps per time-parallel segment, a multiple of chunk; 0 lets `segment_chunks` choose, a value ≥ L
    walks the whole sequence in one segment (the sequential kernels);
    state_slice (KLA scan only; the selective scan takes 0): key dimensions per scan: the KLA scan of S key
    dimensions runs as the sum of scans over consecutive slices of this many (the last one narrower when it does
    not divide S), each with these launch parameters; 0, or a value ≥ S, scans the whole state at once
    (kernels/mobius_scan.py).
    """

    block_m: int = 32
    chunk: int = 32
    num_warps: int = 1
    num_stages: int = 4
    unroll: int = 4
    bwd_block_m: int = 16
    bwd_num_warps: int = 1
    bwd_num_stages: int = 3
    bwd_unroll: int = 2
    segment: int = 0
    state_slice: int = 0


def check_config(config: ScanConfig) -> None:
    """Raise ValueError naming the first ScanConfig field that the kernels cannot use."""
    for name in ("block_m", "bwd_block_m", "num_warps", "bwd_num_warps"):
        value = getattr(config, name)
        if value < 1 or value & (value - 1):
            raise ValueError(f"ScanConfig.{name}={value} must be a power of two")
    for name in ("block_m", "bwd_block_m"):
        if getattr(config, name) < 2:
            raise ValueError(f"ScanConfig.{name}={getattr(config, name)} must be >= 2 (16-bit rows are read in pairs)")
    for name in ("chunk", "num_stages", "unroll", "bwd_num_stages", "bwd_unroll"):
        if getattr(config, name) < 1:
            raise ValueError(f"ScanConfig.{name}={getattr(config, name)} must be >= 1")
    if config.state_slice < 0:
        raise ValueError(f"ScanConfig.state_slice={config.state_slice} must be >= 0 (0: the whole state)")
    if config.segment < 0 or config.segment % config.chunk:
        raise ValueError(
            f"ScanConfig.segment={config.segment} must be 0 or a positive multiple of chunk={config.chunk}"
        )


# The time-parallel split (kernels/NOTES.md, "Time-parallel split"), set from `python kernels/bench_scan.py --segments`
# on an H200 (2026-12-01): with B·M·S ≥ 196,608 chains (B8 M1536 S16, B16 M1024 S16) the sequential walk beat every
# split (splits cost 10-30 % more: the summary and carry passes are extra work on a GPU already full); with 65,536 or
# fewer the split won by 1.9-9.6x, best with about 2^20 (chain, segment) pairs: within 2 % of the best segment length
# at all six such shapes, where the old target of 196,608 pairs was 7-29 % behind. Segments shorter than
# MIN_SEGMENT_STEPS spend more on the summary and the carry than the extra parallelism gains.
SEQUENTIAL_MIN_CHAINS = 196_608
SPLIT_TARGET_CHAINS = 1 << 20
MIN_SEGMENT_STEPS = 256


# Triton 3.6 on an H200 (measured 2026-12-01): KLA's backward summary kernel faults with "misaligned address"
# when software pipelining (num_stages > 1) and loop unrolling (> 1) are combined; with either alone it matches the
# float64 oracle. The selective scan's summary kernels fault the same way. These summary loops (one pass per
# time segment, off the critical path of the main walk) are therefore never unrolled.
SUMMARY_UNROLL = 1


def pair_unroll(bwd_unroll: int) -> int:
    """The backward kernels' PAIR_UNROLL: their loops take the steps in pairs (half the chunk's states kept in
    scratch), so `ScanConfig.bwd_unroll` steps per loop body are this many pairs (at least one)."""
    return max(1, bwd_unroll // 2)


def segment_chunks(batch: int, length: int, channels: int, state_size: int, config: ScanConfig) -> int:
    """Chunks per time-parallel segment; a result ≥ ceil(L / chunk) means one segment (the sequential walk).

    `config.segment` > 0 fixes the segment length (in steps); 0 walks L in one segment when B·M·S ≥
    SEQUENTIAL_MIN_CHAINS, else cuts it into the fewest segments that give SPLIT_TARGET_CHAINS (b, m, s, segment)
    chains, none shorter than MIN_SEGMENT_STEPS.
    """
    if config.segment:
        return config.segment // config.chunk
    chains = batch * channels * state_size
    if chains >= SEQUENTIAL_MIN_CHAINS:
        return triton.cdiv(length, config.chunk)
    wanted = triton.cdiv(SPLIT_TARGET_CHAINS, chains)
    n_segments = min(wanted, max(1, length // MIN_SEGMENT_STEPS))
    return triton.cdiv(triton.cdiv(length, config.chunk), n_segments)


def check_kernel_device(tensors: dict[str, Tensor]) -> None:
    """Raise ValueError unless all tensors share one device the Triton kernels can run on, in a dtype they take."""
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    for name, device in devices.items():
        if device != first:
            raise ValueError(f"{name} is on {device} but the other inputs are on {first}")
    if first.type != "cuda" and not interpreting():
        raise ValueError(f"the Triton kernels need CUDA tensors (got {first}); set TRITON_INTERPRET=1 to run on CPU")
    for name, t in tensors.items():
        if t.dtype not in KERNEL_DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; the Triton kernels take {KERNEL_DTYPES}")


def check_offsets(length: int, channels: int, state_size: int) -> None:
    """The kernels index one batch row with int32 offsets (t·M, t·S): raise ValueError if L·max(M, S) ≥ 2^31."""
    if length * max(channels, state_size) >= 2**31:
        raise ValueError(f"L·M = {length}·{channels} is too large for the kernels' int32 offsets; split the sequence")


def state_pad(state_size: int) -> int:
    """S_PAD: the state size rounded up to a power of two, at least 2 (16-bit rows are read in pairs)."""
    return max(2, triton.next_power_of_2(state_size))


def to_kernel_layout(x: Tensor | None) -> Tensor | None:
    """[..., M, S] -> contiguous [..., S, M] (channels contiguous, as the kernels read state-shaped tensors)."""
    return None if x is None else x.transpose(-1, -2).contiguous()


def from_kernel_layout(x: Tensor | None) -> Tensor | None:
    """[..., S, M] -> contiguous [..., M, S]."""
    return None if x is None else x.transpose(-1, -2).contiguous()


@triton.jit
def rcp(x, FAST_RCP: tl.constexpr):
    """1/x; with FAST_RCP one MUFU.RCP (rcp.approx.ftz, ≤ 1 ulp; x here is ≥ 1 or a state), else IEEE-style division."""
    if FAST_RCP:
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 / x


# 16-bit inputs. Triton's software pipeliner prefetches a load only when each thread reads at least 32 bits; at the
# kernels' widths (a row of BM = 32 channels or S = 16 states spread over one warp) a bf16/fp16 row gives each
# thread one 16-bit element, so those loads were not prefetched (16-bit ld.global in the sm_90 PTX, no cp.async):
# the likely cause of bf16 v, k, q making the forward slower than fp32 inputs (1.415 against 0.615 ms on an H200,
# kernels/NOTES.md). A 16-bit tensor whose rows have an even length is therefore passed as its int32 view and every
# row is read as words of two elements, split in registers exactly (a bf16 is the high half of a float32; an fp16
# is converted).
PLAIN = tl.constexpr(0)  # the tensor itself, any float dtype, one element per lane
BF16_PAIRS = tl.constexpr(1)  # int32 view of a bfloat16 tensor
FP16_PAIRS = tl.constexpr(2)  # int32 view of a float16 tensor
_PAIRED = {torch.bfloat16: BF16_PAIRS.value, torch.float16: FP16_PAIRS.value}


def as_rows(x: Tensor | None) -> tuple[Tensor | None, int]:
    """(what a kernel reads, its load format): the int32 view of a contiguous 16-bit tensor whose last dimension and
    storage offset are even (two elements per word), else x itself (PLAIN)."""
    if x is None or x.dtype not in _PAIRED or x.shape[-1] % 2 or x.storage_offset() % 2 or not x.is_contiguous():
        return x, PLAIN.value
    return x.view(torch.int32), _PAIRED[x.dtype]


@triton.jit
def load_row(ptr, start, limit, N: tl.constexpr, FMT: tl.constexpr):
    """Elements [start, start + N) of a flat tensor as float32 [N]; positions ≥ limit read 0.

    ptr is the tensor (FMT PLAIN) or its int32 view (BF16_PAIRS, FP16_PAIRS; start and limit are even);
    start and limit count elements in both cases. limit None: the caller knows the N elements are in bounds, and
    they are read without a mask (a per-lane mask costs predicate arithmetic at every pipelined copy).
    """
    mask, other = None, None
    if FMT == PLAIN:
        o = start + tl.arange(0, N)
        if limit is not None:
            mask, other = o < limit, 0.0
        return tl.load(ptr + o, mask=mask, other=other).to(tl.float32)
    else:
        o = start // 2 + tl.arange(0, N // 2)  # words
        if limit is not None:
            mask, other = o < limit // 2, 0
        w = tl.load(ptr + o, mask=mask, other=other)
        if FMT == BF16_PAIRS:  # element 2j is the low half of word j (little-endian)
            lo = (w << 16).to(tl.float32, bitcast=True)
            hi = (w & -65536).to(tl.float32, bitcast=True)
        else:
            lo = w.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        return tl.interleave(lo, hi)


@triton.jit
def row_start(ptr, t, stride, FMT: tl.constexpr):
    """Row t of a [rows, stride] tensor read with `load_row` in format FMT (ptr: the tensor, or its int32 view for
    the paired formats, whose rows have an even length): `load_row(row_start(ptr, t, M, FMT), m0, M, ...)` reads
    elements m0.. of row t, and its offsets and mask are the same at every t. A kernel takes each batch row's start
    once (a 64-bit product) and steps within it by int32 t·stride (`check_offsets`), so a time step's row pointer is
    one scalar add and its masks are loop-invariant."""
    if FMT == PLAIN:
        return ptr + t * stride
    else:
        return ptr + (t * stride) // 2  # words of two elements


@triton.jit
def store_reduced_row(ptr, x, o_m, o_s, m_m, S_PAD: tl.constexpr, BM: tl.constexpr, EVICT_FIRST: tl.constexpr):
    """Store x [BM] (a sum over the state rows s: every row of the [S_PAD, BM] layout holds it) at ptr + o_m where
    m_m, in ptr's dtype, written by the s = 0 row of that layout, so no exchange is compiled: a plain [BM] store is
    converted to a one-element-per-lane layout through shared memory, with a barrier, at every step. The offsets are
    written with a contiguity of 4 elements (o_m itself has BM), so that a 16-bit row, too, gets the [S_PAD, BM]
    layout of 4 channels per lane (the store of 8 contiguous 16-bit elements per lane would be another layout).
    EVICT_FIRST: store with eviction_policy="evict_first" (rows read by nothing that follows in the kernel)."""
    o = (o_m // 4) * 4 + o_m % 4  # = o_m
    p = ptr + (o[None, :] + 0 * o_s[:, None])  # [S_PAD, BM]
    m = (o_s == 0)[:, None] & m_m[None, :]
    x = tl.broadcast_to(x[None, :], (S_PAD, BM)).to(ptr.dtype.element_ty)
    if EVICT_FIRST:
        tl.store(p, x, mask=m, eviction_policy="evict_first")
    else:
        tl.store(p, x, mask=m)


@triton.jit
def load_row_spread(ptr, start, limit, N: tl.constexpr, FMT: tl.constexpr):
    """`load_row` for a row whose neighbouring elements sit in different lanes of the caller's layout (the KLA
    forward's [BM] channel rows: lane c holds channels c, c + 8, c + 16, c + 24). There the two halves of a word
    belong to two lanes, so `load_row`'s `tl.interleave` is an exchange through shared memory (a barrier and a
    round trip at every step, on the same scratch buffer as the y stores). Here each element reads the whole word
    that holds it (each word is read twice, by the two lanes that need it: the same one-word-per-lane cp.async as a
    float32 row) and keeps its own half in place; the row comes out in whatever layout the caller uses, exactly.
    limit None: the N elements are in bounds and are read without a mask (as `load_row`).
    """
    if FMT == PLAIN:
        return load_row(ptr, start, limit, N, FMT)
    else:
        i = tl.arange(0, N)
        mask, other = None, None
        if limit is not None:
            mask, other = start + i < limit, 0
        w = tl.load(ptr + (start // 2 + i // 2), mask=mask, other=other)
        shift = (i % 2) * 16  # element start + i is the low half of its word when i is even (start is even)
        if FMT == BF16_PAIRS:  # a bf16 is the high half of a float32
            return ((w >> shift) << 16).to(tl.float32, bitcast=True)
        else:
            return (w >> shift).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
