"""Benchmark the KLA scan and selective-scan backends; prints Markdown tables for kernels/NOTES.md.

    python kernels/bench_scan.py            # B=8, L=2048, M=1536, S=16, then L from 512 to 16384
    python kernels/bench_scan.py --quick    # one small size, a sanity run
    python kernels/bench_scan.py --tune     # Triton launch configs at the main size
    python kernels/bench_scan.py --lengths  # sequential vs time-parallel per token, 16,384 tokens a call, L 512..65536
    python kernels/bench_scan.py --dtypes   # fp32 vs 16-bit inputs at the kla_45m shape (B16 L2048 M1024 S16)
    python kernels/bench_scan.py --segments # f+b(y) by segment length at small batch: tunes common.segment_chunks
    python kernels/bench_scan.py --states   # wide keys (S 16, 32, 64) whole against in slices of 16, MQAR's layer
    python kernels/bench_scan.py --registers  # registers and spills per thread by launch config (no GPU needed)

Times are medians of `triton.testing.do_bench` in ms. The floor of a row is the larger of its HBM time
(bytes that must move, at PEAK_HBM_GB_S) and its arithmetic time (FLOP_PER_ELEM operations per
(b, t, m, s) element, at PEAK_FP32_TFLOPS); "× floor" is the measured time over that floor.
Without CUDA it prints a skip message and exits 0, except --registers, which compiles for sm_90 on any machine
(kernels/sm90.py; with TRITON_INTERPRET unset).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

PEAK_HBM_GB_S = 4800.0  # H200 SXM datasheet HBM3e bandwidth, GB/s
PEAK_FP32_TFLOPS = 67.0  # H200 SXM datasheet non-tensor fp32, TFLOP/s
FLOP_PER_ELEM = {"fwd": 27, "fwd+bwd": 81}  # ~25 ops + 2 reciprocals forward; backward ≈ 2× forward
SS_FLOP_PER_ELEM = {"fwd": 7, "fwd+bwd": 21}  # exp (mul + ex2), 2 fma, 1 mul, readout fma; backward ≈ 2× forward
MAIN = dict(batch=8, length=2048, channels=1536, state=16)
SWEEP_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)


DEVICE = "cuda"  # where the benchmarks run (tests swap in the CPU and Triton's interpreter)


def kla_inputs(batch: int, length: int, channels: int, state: int, dtype=torch.float32) -> list[torch.Tensor]:
    """Random inputs on the GPU shaped like the KLA layer's (unit-norm k, q; Λ from a softplus)."""
    dev = DEVICE
    v = torch.randn(batch, length, channels, device=dev)
    lambda_v = 1.0 / (F.softplus(torch.randn(batch, length, channels, device=dev)) + 1e-4)
    k = F.normalize(torch.randn(batch, length, state, device=dev), dim=-1)
    q = F.normalize(torch.randn(batch, length, state, device=dev), dim=-1)
    a = torch.exp(-0.5 * F.softplus(torch.randn(channels, state, device=dev)))
    p = 0.05 * F.softplus(torch.randn(channels, state, device=dev))
    return [x.to(dtype) for x in (v, lambda_v, k, q, a, p)]


def kla_floor_ms(mode: str, batch: int, length: int, channels: int, state: int) -> tuple[float, float, float]:
    """(floor ms, bytes, flops) of the scan: fwd moves v, Λ in and y, y_var out (fp32); bwd adds 6 more such."""
    elems = batch * length * channels
    mode = "fwd+bwd" if mode.startswith("fwd+bwd") else mode
    bytes_ = 4 * elems * (4 if mode == "fwd" else 10)
    flops = FLOP_PER_ELEM[mode] * elems * state
    return max(bytes_ / (PEAK_HBM_GB_S * 1e9), flops / (PEAK_FP32_TFLOPS * 1e12)) * 1e3, bytes_, flops


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(median ms, peak GB allocated during one call)."""
    from triton.testing import do_bench

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 1e9
    return do_bench(fn, warmup=25, rep=100, return_mode="median"), peak


def scan_runners(
    backend: str, inputs: list[torch.Tensor], config=None, precision_floor: float | None = None, variance: bool = True
) -> dict[str, Callable[[], object]]:
    """Callables for the forward and the forward+backward of one backend (with `precision_floor`, inputs[1] is
    log σ² and the Triton kernels form Λ from it). "fwd" computes y_var unless `variance` is False; "fwd+bwd"
    always (its loss reads it); "fwd+bwd (y)" never, as a KLA layer in training (`kla_scan(variance=False)`)."""
    if backend == "triton":
        from klalm.kernels.mobius_scan import kla_scan_triton

        scan = lambda *x, variance=True: kla_scan_triton(
            *x, config=config, precision_floor=precision_floor, variance=variance
        )  # fmt: skip
    else:
        from klalm.ops.scan import kla_scan

        scan = lambda *x, variance=True: kla_scan(*x, backend=backend, variance=variance)
    grads_in = [x.detach().clone().requires_grad_() for x in inputs]

    def fwd_bwd():
        y, y_var, state = scan(*grads_in)
        (y.sum() + y_var.sum() + state.lam.sum() + state.eta.sum()).backward()
        for x in grads_in:
            x.grad = None

    def fwd_bwd_y():  # the training path: a KLA layer that does not return its variance asks for y only
        scan(*grads_in, variance=False)[0].sum().backward()
        for x in grads_in:
            x.grad = None

    def fwd():
        with torch.no_grad():
            return scan(*inputs, variance=variance)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd, "fwd+bwd (y)": fwd_bwd_y}


def available_backends() -> list[str]:
    """The backends timed here: the Triton kernels and klalm's torch backend."""
    from klalm.ops.scan import BACKENDS

    return [name for name in ("triton", "torch") if name in BACKENDS]


def bench_cells(runners: dict[str, Callable[[], object]], floors: dict[str, tuple[float, float, float]]) -> list[str]:
    """Timing cells (ms, peak GB, GB/s, GFLOP/s, × floor) for the fwd and fwd+bwd runners."""
    cells = []
    for mode, fn in runners.items():
        floor, bytes_, flops = floors[mode]
        try:
            ms, peak = timed(fn)
        except torch.cuda.OutOfMemoryError:
            cells += ["OOM"] * 5
            torch.cuda.empty_cache()
            continue
        cells += [
            f"{ms:.3f}",
            f"{peak:.2f}",
            f"{bytes_ / ms / 1e6:.0f}",
            f"{flops / ms / 1e6:.0f}",
            f"{ms / floor:.1f}",
        ]
    return cells


def bench_kla_row(backend: str, shape: dict, config=None) -> list[str]:
    runners = scan_runners(backend, kla_inputs(**shape), config)
    floors = {mode: kla_floor_ms(mode, **shape) for mode in runners}
    label = f"{shape['batch']}x{shape['length']}x{shape['channels']}x{shape['state']}"
    return [f"kla {backend}", label] + bench_cells(runners, floors)


def ss_floor_ms(mode: str, batch: int, length: int, channels: int, state: int) -> tuple[float, float, float]:
    """Selective scan: fwd moves u, Δ in and y out (fp32); the backward adds gy, du, dΔ and re-reads u, Δ."""
    elems = batch * length * channels
    bytes_ = 4 * elems * (3 if mode == "fwd" else 8)
    flops = SS_FLOP_PER_ELEM[mode] * elems * state
    return max(bytes_ / (PEAK_HBM_GB_S * 1e9), flops / (PEAK_FP32_TFLOPS * 1e12)) * 1e3, bytes_, flops


def ss_runners(
    backend: str, shape: dict, config=None, narrow: torch.dtype | None = None
) -> dict[str, Callable[[], object]]:
    """Forward and forward+backward callables of the selective scan (Mamba-1 shapes: u, Δ [B, L, M], A [M, N],
    B, C [B, L, N], D [M]); "fwd+bwd (y)" leaves the final state without gradient, as a Mamba layer in training.
    `narrow`: u, B and C in this dtype (what a Mamba layer hands the scan under autocast; Δ stays float32)."""
    from klalm.ops.selective_scan import selective_scan

    batch, length, channels, n = shape["batch"], shape["length"], shape["channels"], shape["state"]
    dev = DEVICE
    inputs = [torch.randn(batch, length, channels, device=dev),
              F.softplus(torch.randn(batch, length, channels, device=dev) - 1.0),
              -torch.exp(0.5 * torch.randn(channels, n, device=dev)),
              torch.randn(batch, length, n, device=dev), torch.randn(batch, length, n, device=dev),
              torch.randn(channels, device=dev)]  # fmt: skip
    if narrow is not None:
        inputs = _narrow(inputs, narrow, SS_LAYER_NARROW)
    if backend == "triton":
        from klalm.kernels.selective_scan import selective_scan_triton

        scan = lambda *x: selective_scan_triton(*x, config=config)  # None: its default_config for the shape
    else:
        scan = lambda *x: selective_scan(*x, backend=backend)
    leaves = [x.detach().clone().requires_grad_() for x in inputs]

    def fwd():
        with torch.no_grad():
            return scan(*inputs)

    def fwd_bwd():
        y, h = scan(*leaves)
        (y.sum() + h.sum()).backward()
        for x in leaves:
            x.grad = None

    def fwd_bwd_y():
        scan(*leaves)[0].sum().backward()
        for x in leaves:
            x.grad = None

    return {"fwd": fwd, "fwd+bwd": fwd_bwd, "fwd+bwd (y)": fwd_bwd_y}


def bench_ss_row(backend: str, shape: dict, config=None) -> list[str]:
    """Selective-scan row of the main table: fwd and fwd+bwd (every output with a gradient)."""
    runners = {mode: fn for mode, fn in ss_runners(backend, shape, config).items() if mode != "fwd+bwd (y)"}
    floors = {mode: ss_floor_ms(mode, **shape) for mode in runners}
    label = "{batch}x{length}x{channels}x{state}".format(**shape)
    return [f"selective {backend}", label] + bench_cells(runners, floors)


def bench_sdpa_row(batch: int, length: int, heads: int = 12, head_dim: int = 64) -> list[str]:
    """Causal SDPA (flash) in bf16 at the KLA model's width: [B, H, T, D] q, k, v."""
    qkv = [torch.randn(batch, heads, length, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    leaves = [x.clone().requires_grad_() for x in qkv]
    fwd = lambda: F.scaled_dot_product_attention(*qkv, is_causal=True)

    def fwd_bwd():
        F.scaled_dot_product_attention(*leaves, is_causal=True).sum().backward()

    cells = ["sdpa bf16", f"{batch}x{length}xH{heads}xD{head_dim}"]
    for fn in (fwd, fwd_bwd):
        ms, peak = timed(fn)
        cells += [f"{ms:.3f}", f"{peak:.2f}", "", "", ""]
    return cells


HEADER = ["impl", "B×L×M×S", "fwd ms", "fwd GB", "fwd GB/s", "fwd GFLOP/s", "fwd × floor",
          "f+b ms", "f+b GB", "f+b GB/s", "f+b GFLOP/s", "f+b × floor",
          "f+b(y) ms", "f+b(y) GB", "f+b(y) GB/s", "f+b(y) GFLOP/s", "f+b(y) × floor"]  # fmt: skip
# f+b: every output (y, y_var, final state) gets a gradient; f+b(y): only y does (a KLA layer in training)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        row = row + [""] * (len(header) - len(row))  # rows without the y-only column
        print("| " + " | ".join(row) + " |", flush=True)


def run_all(quick: bool, skip_torch: bool) -> None:
    shapes = [dict(batch=2, length=512, channels=256, state=16)] if quick else [MAIN]
    if not quick:
        shapes += [dict(MAIN, length=n) for n in SWEEP_LENGTHS if n != MAIN["length"]]
    rows = []
    for shape in shapes:
        floor = kla_floor_ms("fwd", **shape)[0], kla_floor_ms("fwd+bwd", **shape)[0]
        print(f"kla floor {shape}: fwd {floor[0]:.3f} ms, fwd+bwd {floor[1]:.3f} ms", flush=True)
        for backend in available_backends():
            if not (skip_torch and backend == "torch"):
                rows.append(bench_kla_row(backend, shape))
        rows.append(bench_sdpa_row(shape["batch"], shape["length"]))
    print_table(HEADER, rows)
    ss_rows = []
    for shape in shapes[:1] if quick else [MAIN, dict(MAIN, length=8192)]:
        floor = ss_floor_ms("fwd", **shape)[0], ss_floor_ms("fwd+bwd", **shape)[0]
        print(f"selective-scan floor {shape}: fwd {floor[0]:.3f} ms, fwd+bwd {floor[1]:.3f} ms", flush=True)
        ss_rows += [bench_ss_row(backend, shape) for backend in ("triton", "torch")]
    print_table(HEADER, ss_rows)


# the backward is issue-bound with few warps to hide latency (kernels/NOTES.md): its variants hold fewer values per
# thread (--registers shows how many registers each needs)
BWD_VARIANTS = [dict(bwd_unroll=1), dict(bwd_num_stages=2, bwd_unroll=1), dict(bwd_block_m=8, bwd_unroll=1),
                dict(bwd_num_warps=2), dict(bwd_block_m=32, bwd_num_warps=2)]  # fmt: skip
TUNE = [dict(), dict(chunk=64), dict(num_stages=3, unroll=2), dict(block_m=16, num_stages=4, unroll=2), *BWD_VARIANTS]


def tune_configs(default):
    """TUNE's variants of a scan's default launch config (each dict replaces those fields), the default first and
    each distinct config once."""
    return list(dict.fromkeys(default._replace(**overrides) for overrides in TUNE))


def run_tune() -> None:
    """Time the Triton kernels over launch configs at the main size, each scan from its own default config."""
    from klalm.kernels.common import ScanConfig
    from klalm.kernels.mobius_scan import DEFAULT_CONFIG as KLA_DEFAULT
    from klalm.kernels.selective_scan import DEFAULT_CONFIG as SS_DEFAULT

    rows = [[f"kla {tuple(c)}"] + bench_kla_row("triton", MAIN, c)[2:] for c in tune_configs(KLA_DEFAULT)]
    rows += [[f"selective {tuple(c)}"] + bench_ss_row("triton", MAIN, c)[2:] for c in tune_configs(SS_DEFAULT)]
    print_table([f"config {ScanConfig._fields}"] + HEADER[2:], rows)


TRAINING_FLAGS = dict(
    HAS_INIT=False,
    PRIOR=False,
    SAVE_CKPT=True,
    HAS_GYV=False,
    WITH_VAR=False,
    HAS_GSTATE=False,
    HAS_CARRY=False,
    LOGVAR=False,
    INIT_COV=False,
    FAST_RCP=True,
    S_PAD=16,
    EVEN_S=True,
    EVEN_M=True,
)  # a KLA layer in training (S = 16)
BF16_ROWS = ("V_FMT", "K_FMT", "Q_FMT", "GY_FMT")  # what a bf16 model hands the scan (as common.BF16_PAIRS)
COMPILED_COLUMNS = {  # column -> key of sm90.resource_usage / sm90.code_counts
    "registers/thread": "registers",
    "stack (spill) bytes/thread": "stack_bytes",
    "shared bytes": "shared_bytes",
    "PTX instructions": "ptx_instructions",
    "bar.sync": "bar_sync",
    "convert_layout": "convert_layout",
}


def run_registers() -> None:
    """What the KLA forward and backward kernels compiled for sm_90 by the installed Triton use (registers, spills,
    shared memory) and contain (instructions, barriers, layout conversions), for the default config and
    BWD_VARIANTS, with float32 rows and with a bf16 model's rows."""
    import triton

    from klalm.kernels.common import BF16_PAIRS, ScanConfig, pair_unroll
    from klalm.kernels.mobius_scan_bwd import _kla_bwd_kernel
    from klalm.kernels.mobius_scan_fwd import _kla_fwd_kernel
    from klalm.kernels.sm90 import code_counts, compile_sm90, resource_usage

    rows = []
    for i, config in enumerate(ScanConfig(**overrides) for overrides in [dict(), *BWD_VARIANTS]):
        bwd = dict(
            BM=config.bwd_block_m,
            CHUNK=config.chunk,
            NUM_STAGES=config.bwd_num_stages,
            PAIR_UNROLL=pair_unroll(config.bwd_unroll),
        )
        kernels = {"bwd": (_kla_bwd_kernel, bwd, config.bwd_num_warps, config.bwd_num_stages)}
        if i == 0:  # the variants change the backward only
            fwd = dict(BM=config.block_m, CHUNK=config.chunk, NUM_STAGES=config.num_stages, UNROLL=config.unroll)
            kernels = {"fwd": (_kla_fwd_kernel, fwd, config.num_warps, config.num_stages), **kernels}
        for name, (fn, launch, warps, stages) in kernels.items():
            for rows_name, formats in (("fp32", {}), ("bf16 v, k, q, dy", dict.fromkeys(BF16_ROWS, BF16_PAIRS.value))):
                kernel = compile_sm90(fn, {**TRAINING_FLAGS, **launch}, formats, warps, stages)
                found = resource_usage(kernel) | code_counts(kernel)
                knobs = ", ".join(f"{k}={v}" for k, v in launch.items() if k != "CHUNK") + f", warps={warps}"
                rows.append([name, knobs, rows_name, *(str(found[key]) for key in COMPILED_COLUMNS.values())])
    path = "the training path: y only, no initial state"
    print(f"\nKLA kernels compiled for sm_90 by Triton {triton.__version__} ({path}):")
    print_table(["kernel", "launch", "rows", *COMPILED_COLUMNS], rows)


LENGTHS_TOKENS = 16_384  # tokens per call of the --lengths sweep (B = max(1, tokens // L))
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
WIDE = dict(channels=1536, state=16)  # M, S of the length sweep (kernels/NOTES.md's main width)
SEQUENTIAL_SEGMENT = 1 << 30  # a ScanConfig.segment ≥ L: one segment, the sequential walk


def timed_ms(fn: Callable[[], object]) -> str:
    """Median ms of `fn` as a table cell, or OOM."""
    try:
        return f"{timed(fn)[0]:.3f}"
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "OOM"


def per_token_ns(ms: str, tokens: int) -> str:
    return ms if ms == "OOM" else f"{float(ms) * 1e6 / tokens:.1f}"


def run_lengths() -> None:
    """Sequential vs time-parallel scans at fixed tokens per call (M1536 S16, fp32): fwd and f+b(y) per token, for
    the KLA scan and the selective scan (the sequential walk on its DEFAULT_CONFIG, the split on its
    `default_config` for the shape)."""
    from klalm.kernels.common import ScanConfig
    from klalm.kernels.selective_scan import DEFAULT_CONFIG, default_config

    def ss_config(shape: dict, segment: int) -> ScanConfig:
        if segment:
            return DEFAULT_CONFIG._replace(segment=segment)
        return default_config(shape["batch"], shape["length"], shape["channels"], shape["state"])

    scans = {  # name -> runners for (shape, segment)
        "KLA scan": lambda shape, seg: scan_runners("triton", kla_inputs(**shape), ScanConfig(segment=seg)),
        "Selective scan": lambda shape, seg: ss_runners("triton", shape, ss_config(shape, seg)),
    }
    width = "M{channels} S{state}".format(**WIDE)
    header = ["L", "B", "seq fwd ms", "seq fwd ns/tok", "seq f+b(y) ms", "seq f+b(y) ns/tok",
              "par fwd ms", "par fwd ns/tok", "par f+b(y) ms", "par f+b(y) ns/tok"]  # fmt: skip
    for name, make_runners in scans.items():
        rows = []
        for length in LENGTHS:
            batch = max(1, LENGTHS_TOKENS // length)
            shape = dict(batch=batch, length=length, **WIDE)
            cells = [str(length), str(batch)]
            for segment in (SEQUENTIAL_SEGMENT, 0):  # 0: the automatic split
                runners = make_runners(shape, segment)
                for mode in ("fwd", "fwd+bwd (y)"):
                    ms = timed_ms(runners[mode])
                    cells += [ms, per_token_ns(ms, batch * length)]
            rows.append(cells)
        print(f"\n{name}, {LENGTHS_TOKENS} tokens per call (B = max(1, {LENGTHS_TOKENS} // L)), {width}, fp32:")
        print_table(header, rows)


DTYPE_SHAPE = dict(batch=16, length=2048, channels=1024, state=16)  # the kla_45m layer's scan
LAYER_NARROW = (0, 2, 3)  # v, k, q: what the KLA layer hands the scan in 16 bits under autocast
SS_LAYER_NARROW = (0, 3, 4)  # u, B, C: what a Mamba layer hands the selective scan in 16 bits under autocast
ALL_NARROW = (0, 1, 2, 3)  # and log σ², once Λ is formed in the kernels
FLOOR = 1e-4  # the KLA layer's precision floor


def run_dtypes(asm_dir: Path | None = None) -> None:
    """fp32 against 16-bit inputs at the kla_45m scan shape: the KLA layer's inputs before and after the in-kernel
    Λ, each at block_m 16, 32 and 64 (16: twice the programs for the GPU's 528 schedulers; 64: two channels per
    thread, another way to 32-bit 16-bit loads).
    With `asm_dir`, the code of every kernel a row launched is written there (`write_asm`)."""
    from klalm.kernels.common import ScanConfig

    f32 = kla_inputs(**DTYPE_SHAPE)
    with_logvar = [f32[0], torch.randn_like(f32[1]), *f32[2:]]  # Λ replaced by log σ², the layer's sensor
    variants = {  # name -> (v, Λ or log σ², k, q, a, p), precision floor (None: the second tensor is Λ)
        "fp32 v, Λ, k, q": (f32, None),
        "fp32 v, log σ², k, q": (with_logvar, FLOOR),
        "bf16 v, k, q; fp32 Λ (what the KLA layer passes)": (_narrow(f32, torch.bfloat16, LAYER_NARROW), None),
        "bf16 v, log σ², k, q (kla_scan_logvar)": (_narrow(with_logvar, torch.bfloat16, ALL_NARROW), FLOOR),
        "fp16 v, k, q; fp32 Λ": (_narrow(f32, torch.float16, LAYER_NARROW), None),
    }
    from klalm.kernels.mobius_scan_bwd import _kla_bwd_kernel
    from klalm.kernels.mobius_scan_fwd import _kla_fwd_kernel

    rows = []
    for i, (name, (inputs, floor)) in enumerate(variants.items()):
        for block_m in (16, 32, 64):
            config = ScanConfig(block_m=block_m)
            runners = scan_runners("triton", inputs, config, precision_floor=floor)
            known = compiled_kernels(_kla_fwd_kernel) | compiled_kernels(_kla_bwd_kernel)
            fwd_ms = timed_ms(runners["fwd"])
            fwd = new_kernels(_kla_fwd_kernel, known)
            y_only_ms = timed_ms(scan_runners("triton", inputs, config, precision_floor=floor, variance=False)["fwd"])
            known |= compiled_kernels(_kla_fwd_kernel)
            fwd_bwd_ms = timed_ms(runners["fwd+bwd (y)"])
            bwd = new_kernels(_kla_bwd_kernel, known)
            if asm_dir is not None:
                write_asm(fwd, asm_dir, f"row{i}_bm{block_m}_fwd")
                write_asm(bwd, asm_dir, f"row{i}_bm{block_m}_bwd")
            rows.append([name, str(block_m), fwd_ms, registers(fwd), y_only_ms, fwd_bwd_ms, registers(bwd)])
    shape = "B{batch} L{length} M{channels} S{state}".format(**DTYPE_SHAPE)
    print(f"\nKLA scan inputs by dtype, {shape} (bwd_block_m 16; registers and spills as the GPU's compiler built "
          "the kernels each call launched):")  # fmt: skip
    header = ["inputs", "block_m", "fwd ms", "fwd regs, spills", "fwd ms, no y_var", "f+b(y) ms", "bwd regs, spills"]
    print_table(header, rows)

    from klalm.kernels.selective_scan import _ss_bwd_kernel, _ss_fwd_kernel

    ss_rows = []
    ss_variants = {"fp32 u, Δ, B, C": None, "bf16 u, B, C; fp32 Δ (what the Mamba layer passes)": torch.bfloat16}
    for name, narrow in ss_variants.items():
        runners = ss_runners("triton", DTYPE_SHAPE, narrow=narrow)
        known = compiled_kernels(_ss_fwd_kernel) | compiled_kernels(_ss_bwd_kernel)
        fwd_ms = timed_ms(runners["fwd"])
        fwd = new_kernels(_ss_fwd_kernel, known)
        known |= compiled_kernels(_ss_fwd_kernel)
        fwd_bwd_ms = timed_ms(runners["fwd+bwd (y)"])
        ss_rows.append([name, fwd_ms, registers(fwd), fwd_bwd_ms, registers(new_kernels(_ss_bwd_kernel, known))])
    print(f"\nSelective scan inputs by dtype, {shape.replace('S', 'N')} (its default config):")
    print_table(["inputs", "fwd ms", "fwd regs, spills", "f+b(y) ms", "bwd regs, spills"], ss_rows)


def compiled_kernels(fn) -> dict[str, object]:
    """key -> Triton CompiledKernel of every variant of the @triton.jit kernel `fn` compiled in this process ({}
    under TRITON_INTERPRET, where nothing is compiled)."""
    caches = getattr(fn, "device_caches", {})
    return {key: kernel for cache in caches.values() for key, kernel in cache[0].items()}


def new_kernels(fn, known: dict[str, object]) -> list | None:
    """The variants of `fn` compiled since `known` was taken (those a call just launched), their binaries loaded so
    that Triton has read their registers and spills from the driver; None under TRITON_INTERPRET."""
    from klalm.kernels.common import interpreting

    if interpreting():
        return None
    new = [kernel for key, kernel in compiled_kernels(fn).items() if key not in known]
    for kernel in new:
        kernel._init_handles()
    return new


def registers(kernels: list | None) -> str:
    """ "registers, spill bytes" of each kernel ("interpreted" when nothing was compiled, "(cached)" when the call
    launched only kernels compiled before)."""
    if kernels is None:
        return "interpreted"
    return "; ".join(f"{kernel.n_regs}, {kernel.n_spills}" for kernel in kernels) or "(cached)"


ASM_KINDS = ("ttgir", "ptx", "sass")


def write_asm(kernels: list | None, folder: Path, stem: str) -> None:
    """Each kernel's TTGIR, PTX and SASS as `folder/stem[_j].{kind}` (SASS needs the cuobjdump Triton ships; a kind
    that cannot be produced is written as a one-line note)."""
    folder.mkdir(parents=True, exist_ok=True)
    for j, kernel in enumerate(kernels or []):
        name = stem if len(kernels) == 1 else f"{stem}_{j}"
        for kind in ASM_KINDS:
            try:
                text = kernel.asm[kind]
            except Exception as err:  # noqa: BLE001 - a missing disassembler must not lose the table
                text = f"not available: {type(err).__name__}: {err}\n"
            (folder / f"{name}.{kind}").write_text(text)


def _narrow(inputs: list[torch.Tensor], dtype: torch.dtype, which: tuple[int, ...]) -> list[torch.Tensor]:
    """The inputs with those at the positions `which` cast to `dtype`."""
    return [x.to(dtype) if i in which else x for i, x in enumerate(inputs)]


SEGMENT_LENGTHS = (256, 512, 1024, 2048, 4096)
SEGMENT_SHAPES = [dict(batch=1, length=16384, **WIDE), dict(batch=2, length=8192, **WIDE),
                  dict(batch=1, length=65536, **WIDE), dict(batch=1, length=16384, channels=512, state=16),
                  # where the sequential walk already has many chains: the main size and the kla_45m training steps
                  # (32,768 tokens at T = 2048, 8192, 16384): where the split starts to pay
                  dict(batch=8, length=2048, **WIDE), dict(batch=16, length=2048, channels=1024, state=16),
                  dict(batch=4, length=8192, channels=1024, state=16),
                  dict(batch=2, length=16384, channels=1024, state=16)]  # fmt: skip


def run_segments() -> None:
    """f+b(y) ms by segment length at small B·M·S, against the sequential walk and the automatic choice: the data
    for common.SEQUENTIAL_MIN_CHAINS, SPLIT_TARGET_CHAINS and MIN_SEGMENT_STEPS."""
    from klalm.kernels.common import ScanConfig, segment_chunks

    rows = []
    for shape in SEGMENT_SHAPES:
        runners = {seg: scan_runners("triton", kla_inputs(**shape), ScanConfig(segment=seg))["fwd+bwd (y)"]
                   for seg in (SEQUENTIAL_SEGMENT, 0, *SEGMENT_LENGTHS)}  # fmt: skip
        seg_chunks = segment_chunks(shape["batch"], shape["length"], shape["channels"], shape["state"], ScanConfig())
        n_segments = -(-shape["length"] // (seg_chunks * ScanConfig().chunk))
        label = "B{batch} L{length} M{channels} S{state}".format(**shape)
        rows.append([label, str(n_segments)] + [timed_ms(fn) for fn in runners.values()])
    print("\nKLA scan f+b(y) ms by segment length in steps (fp32):")
    print_table(["shape", "auto: segments", "sequential", "auto", *map(str, SEGMENT_LENGTHS)], rows)


STATES_SHAPE = dict(batch=256, length=2048, channels=256)  # MQAR's long-cell layer (d_model 128, batch 256)
STATES = (16, 32, 64)
STATE_SLICE = 16
WHOLE_STATE_CONFIGS = {32: dict(bwd_block_m=8), 64: dict(block_m=8, bwd_block_m=4)}  # the defaults before slices


def run_states() -> None:
    """f+b(y) of the KLA scan with bf16 v, k, q at STATES_SHAPE for each S of STATES: the whole state in one scan
    (`default_config(S)`, or WHOLE_STATE_CONFIGS[S] where the default slices) against slices of STATE_SLICE key
    dimensions (`state_slice`), in ms and in ps per (b, t, m, s) element; each S's whole scan again last (drift)."""
    from klalm.kernels.common import ScanConfig
    from klalm.kernels.mobius_scan import default_config

    rows = []
    for state in STATES:
        shape = dict(STATES_SHAPE, state=state)
        inputs = _narrow(kla_inputs(**shape), torch.bfloat16, LAYER_NARROW)
        whole = ScanConfig(**WHOLE_STATE_CONFIGS[state]) if state in WHOLE_STATE_CONFIGS else default_config(state)
        sliced = default_config(STATE_SLICE)._replace(state_slice=STATE_SLICE)
        elements = shape["batch"] * shape["length"] * shape["channels"] * state
        sliced_row = [(f"slices of {STATE_SLICE}", sliced)] if state > STATE_SLICE else []  # else: the whole scan
        for label, config in [("whole", whole), *sliced_row, ("whole, again", whole)]:
            ms = timed_ms(scan_runners("triton", inputs, config, variance=False)["fwd+bwd (y)"])
            ps = ms if ms == "OOM" else f"{float(ms) * 1e9 / elements:.2f}"
            rows.append([str(state), label, str(tuple(config)), ms, ps])
        del inputs
    print("\nKLA scan f+b(y), B{batch} L{length} M{channels}, bf16 v, k, q:".format(**STATES_SHAPE))
    print_table(["S", "scan", "config", "f+b(y) ms", "ps / element"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small size only")
    parser.add_argument("--tune", action="store_true", help="sweep Triton launch configs at the main size")
    parser.add_argument("--skip-torch", action="store_true", help="leave out the (slow) torch KLA backend")
    parser.add_argument("--lengths", action="store_true", help="sequential vs time-parallel at fixed tokens per call")
    parser.add_argument("--dtypes", action="store_true", help="fp32 vs 16-bit inputs at the kla_45m scan shape")
    parser.add_argument("--segments", action="store_true", help="f+b(y) by segment length at small batch")
    parser.add_argument("--states", action="store_true", help="wide states whole vs in slices, MQAR's layer")
    parser.add_argument("--registers", action="store_true", help="registers per thread by config (no GPU needed)")
    parser.add_argument("--asm", type=Path, default=None, help="with --dtypes: write the TTGIR, PTX and SASS of "
                        "every kernel each row launched into this folder")  # fmt: skip
    args = parser.parse_args()
    if args.registers:
        run_registers()
        return
    if not torch.cuda.is_available():
        print("bench_scan: no CUDA device found; skipping (the kernels are benchmarked on a GPU only)")
        return
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    chosen = [run for flag, run in ((args.lengths, run_lengths), (args.dtypes, lambda: run_dtypes(args.asm)),
                                    (args.segments, run_segments), (args.states, run_states),
                                    (args.tune, run_tune)) if flag]  # fmt: skip
    for run in chosen:
        run()
    if not chosen:
        run_all(args.quick, args.skip_torch)


if __name__ == "__main__":
    main()
