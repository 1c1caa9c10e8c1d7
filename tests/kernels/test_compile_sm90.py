"""Every Triton kernel compiles for an H100/H200 (sm_90) with the installed Triton, on a machine without a GPU.

The interpreter that runs the other kernel tests accepts code the compiler rejects (a global that is not a constexpr,
a Python construct Triton cannot lower), so this catches those errors before a GPU session does. It also pins the
16-bit input path: rows of bf16/fp16 tensors are read as 32-bit words (`common.load_row`), so the PTX of the time
loops has no 16-bit global load (Triton's pipeliner prefetches only loads of at least 32 bits per thread).
On a CUDA machine these tests are skipped: there the `gpu` tests compile the kernels for the real device.

The compiler runs in a child process (this file run as a script), because the test session imports Triton in
interpreter mode (TRITON_INTERPRET=1), where `@triton.jit` functions cannot be compiled.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from klalm.kernels.sm90 import ROW_TENSORS, compile_sm90

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu tests compile for the real device")

FLAGS = dict(HAS_INIT=True, PRIOR=False, SAVE_CKPT=True, HAS_GYV=True, HAS_GSTATE=False, HAS_CARRY=True, LOGVAR=True)
FLAGS |= dict(HAS_D=True, REVERSE=True, INIT_COV=True, WITH_VAR=True)
LAUNCH = dict(
    BM=32, S_PAD=16, N_PAD=16, CHUNK=32, NUM_STAGES=3, UNROLL=2, PAIR_UNROLL=1, FAST_RCP=True, EVEN_S=True, EVEN_M=True
)
KERNELS = {  # name -> (module, kernel)
    "fwd": ("mobius_scan_fwd", "_kla_fwd_kernel"),
    "fwd_summary": ("mobius_scan_fwd", "_kla_fwd_summary_kernel"),
    "fwd_carry": ("mobius_scan_fwd", "_kla_fwd_carry_kernel"),
    "bwd": ("mobius_scan_bwd", "_kla_bwd_kernel"),
    "bwd_summary": ("mobius_scan_bwd", "_kla_bwd_summary_kernel"),
    "bwd_carry": ("mobius_scan_bwd", "_kla_bwd_carry_kernel"),
    "ss_fwd": ("selective_scan", "_ss_fwd_kernel"),
    "ss_fwd_summary": ("selective_scan", "_ss_fwd_summary_kernel"),
    "ss_carry": ("selective_scan", "_ss_carry_kernel"),
    "ss_bwd": ("selective_scan", "_ss_bwd_kernel"),
    "ss_bwd_summary": ("selective_scan", "_ss_bwd_summary_kernel"),
}
PLAIN, BF16_PAIRS, FP16_PAIRS = 0, 1, 2  # common.PLAIN, .BF16_PAIRS, .FP16_PAIRS
# one compile covers both branches of `load_row`: v, k, gy (u, B) as a 16-bit model's (pairs), the others float32
MIXED = {"V_FMT": BF16_PAIRS, "K_FMT": BF16_PAIRS, "GY_FMT": BF16_PAIRS, "U_FMT": BF16_PAIRS, "B_FMT": BF16_PAIRS}


def compile_ptx(fn, formats: dict[str, int]) -> str:
    """PTX of `fn` for sm_90 with one warp; row tensors in their `formats` (PLAIN: float32; pairs: int32 words)."""
    return compile_sm90(fn, {**FLAGS, **LAUNCH}, formats, num_warps=1).asm["ptx"]


def load_counts(ptx: str) -> dict[str, int]:
    """Global loads by kind in a PTX text: 16-bit direct loads and asynchronous (pipelined) copies."""
    return {"ld16": len(re.findall(r"ld\.global[\w.:]*\.[bu]16", ptx)), "cp_async": ptx.count("cp.async.c")}


def compile_all() -> dict[str, dict[str, int] | str]:
    """{kernel name[/bf16]: load counts, or the compile error} for every kernel (run in a child process)."""
    import importlib

    cases = {name: (KERNELS[name], MIXED) for name in KERNELS}
    cases["fwd/fp16"] = (KERNELS["fwd"], {f: FP16_PAIRS for f in ROW_TENSORS})
    results = {}
    for name, ((module, kernel), formats) in cases.items():
        try:
            fn = getattr(importlib.import_module(f"klalm.kernels.{module}"), kernel)
            results[name] = load_counts(compile_ptx(fn, formats))
        except Exception as err:  # reported by the test that asks for this kernel
            results[name] = f"{type(err).__name__}: {err}"
    return results


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", [*KERNELS, "fwd/fp16"])
def test_compiles_for_sm90(compiled, name):
    assert isinstance(compiled[name], dict), f"{name}: {compiled[name]}"


@pytest.mark.parametrize("name", ["fwd", "fwd/fp16", "bwd", "fwd_summary", "bwd_summary", "ss_fwd", "ss_bwd"])
def test_16bit_rows_load_32_bits_and_are_pipelined(compiled, name):
    counts = compiled[name]
    assert counts["ld16"] == 0, "a 16-bit global load in the time loop: the pipeliner does not prefetch it"
    assert counts["cp_async"] > 0


def test_registers_table_reads_the_compiled_kernels():
    """`bench_scan.py --registers` (default config only): registers between 1 and the 255 a thread may hold."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "from klalm.kernels import bench_scan; bench_scan.BWD_VARIANTS = []; bench_scan.run_registers()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| fwd") or
            line.startswith("| bwd")]  # fmt: skip
    assert [(r[0].strip(), r[2].strip()) for r in rows] == [
        ("fwd", "fp32"), ("fwd", "bf16 v, k, q, dy"), ("bwd", "fp32"), ("bwd", "bf16 v, k, q, dy")]  # fmt: skip
    assert all(1 <= int(r[3]) <= 255 and int(r[4]) >= 0 and int(r[5]) > 0 for r in rows)
    assert all(int(r[6]) > 0 and int(r[7]) >= 0 and int(r[8]) >= 0 for r in rows)  # instructions, barriers, layouts


if __name__ == "__main__":
    print(json.dumps(compile_all()))
