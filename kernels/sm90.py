"""Compile the scans' Triton kernels for an H100/H200 (sm_90) on a machine without a GPU, and read what the compiled
code uses: registers and stack (register spills) per thread, shared memory per program, and counts of its
instructions, barriers and layout conversions.

Triton's compiler lowers a kernel to PTX and assembles it with its own ptxas into a cubin; `cuobjdump -res-usage`
(shipped in Triton's wheel beside ptxas) reads the cubin's resource use. tests/kernels/test_compile_sm90.py compiles
every kernel this way; `python kernels/bench_scan.py --registers` prints the training-path kernels' use by launch
config. The numbers are those of the installed Triton; a GPU machine with another Triton version allocates its own.

This needs Triton's compiler, not its interpreter: run it where TRITON_INTERPRET is unset.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from klalm.kernels.common import BF16_PAIRS, PLAIN

INTS = {"L", "M", "S", "N", "n_chunks", "seg_chunks", "seg_steps", "n_seg"}  # scalar int arguments
FLOATS = {"floor"}  # scalar float arguments
ROW_TENSORS = {  # pointer arguments read with `common.load_row`, by the name of their format constexpr
    "V_FMT": "v_ptr",
    "LV_FMT": "lam_v_ptr",
    "K_FMT": "k_ptr",
    "Q_FMT": "q_ptr",
    "GY_FMT": "gy_ptr",
    "GYV_FMT": "gyv_ptr",
    "U_FMT": "u_ptr",
    "DT_FMT": "dt_ptr",
    "B_FMT": "B_ptr",
    "C_FMT": "C_ptr",
}
# pointer arguments written as words of two (int32 views) in a paired format, by the name of their format constexpr:
# the KLA forward's 16-bit y with Λ given and without y_var (`mobius_scan_fwd`'s TRIM_16BIT, `_store_row_pairs`)
WRITTEN_ROWS = {"Y_FMT": "y_ptr"}
OUTPUTS_LIKE = {  # pointer arguments written in the dtype of an input row tensor, by that tensor's format constexpr
    "y_ptr": ("V_FMT", "U_FMT"),
    "y_var_ptr": ("V_FMT",),
    "dv_ptr": ("V_FMT",),
    "dlv_ptr": ("LV_FMT",),
    "du_ptr": ("U_FMT",),
    "ddt_ptr": ("DT_FMT",),
}


def compile_sm90(fn, constexprs: dict[str, Any], formats: dict[str, int] | None = None, num_warps: int = 1,
                 num_stages: int = 3):  # fmt: skip
    """`fn` compiled for sm_90; returns Triton's CompiledKernel (`.asm["ptx"]`, `.asm["cubin"]`).

    constexprs: a value for each of fn's constexpr arguments (extra names are ignored); formats: the `load_row`
    format of each row tensor by its format constexpr's name (default PLAIN; a paired tensor's pointer is then an
    int32 pointer, and the outputs written in its dtype, OUTPUTS_LIKE, are bf16 or fp16 pointers, as the ops launch
    them). Every other argument is a float32 pointer, or an int32/float32 scalar (INTS, FLOATS), and pointers and
    ints are marked divisible by 16, as Triton specialises the real sizes (M, S multiples of 16).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    formats = formats or {}
    signature, values, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in ROW_TENSORS or name in WRITTEN_ROWS:
            values[name] = formats.get(name, PLAIN.value)
        elif name in constexprs:
            values[name] = constexprs[name]
        elif name in FLOATS:
            signature[name] = "fp32"
            continue
        else:
            rows = ROW_TENSORS | WRITTEN_ROWS
            paired = any(formats.get(f, PLAIN.value) != PLAIN.value and rows[f] == name for f in rows)
            like = [formats[f] for f in OUTPUTS_LIKE.get(name, ()) if formats.get(f, PLAIN.value) != PLAIN.value]
            output = ("*bf16" if like[0] == BF16_PAIRS.value else "*fp16") if like else "*fp32"
            signature[name] = "i32" if name in INTS else "*i32" if paired else output
            attrs[(i,)] = [["tt.divisibility", 16]]
            continue
        signature[name] = "constexpr"
    source = ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def resource_usage(kernel) -> dict[str, int]:
    """{"registers", "stack_bytes"} per thread from a compiled kernel's cubin (the stack frame holds what ptxas spills
    when the registers run out) and Triton's "shared_bytes" per program (its pipeline buffers and layout exchanges)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        text = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    found = {key: re.search(rf"\b{key}:(\d+)", text) for key in ("REG", "STACK")}
    missing = [key for key, match in found.items() if match is None]
    if missing:
        raise RuntimeError(f"cuobjdump -res-usage printed no {missing}: {text[-500:]}")
    return {"registers": int(found["REG"][1]), "stack_bytes": int(found["STACK"][1]),
            "shared_bytes": kernel.metadata.shared}  # fmt: skip


def code_counts(kernel) -> dict[str, int]:
    """What the compiled code does, counted in its text: PTX instructions (lines that are not directives, labels or
    braces), `bar.sync` barriers in the PTX, and `ttg.convert_layout` ops in the TTGIR (moves of a tensor between
    register layouts; across lanes they go through shared memory). Counts of the whole kernel, loops unrolled."""
    ptx = kernel.asm["ptx"].splitlines()
    instructions = [line for line in ptx if line.strip() and not re.match(r"\s*(\.|//|\$|\{|\})", line)]
    return {"ptx_instructions": len(instructions), "bar_sync": sum(line.count("bar.sync") for line in ptx),
            "convert_layout": kernel.asm["ttgir"].count("ttg.convert_layout")}  # fmt: skip
