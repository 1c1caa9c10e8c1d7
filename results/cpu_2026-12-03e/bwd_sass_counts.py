"""No GPU: the KLA training backward compiled for sm_90 (Triton's compiler and the cuobjdump it ships), at
bwd_block_m 16 (the default) and 8, with fp32 rows and with a bf16 model's rows: SASS instructions of the whole
kernel, some opcodes, registers, and the TTGIR's layout conversions. Run where TRITON_INTERPRET is unset, with the
GPU image's Triton (3.6):

    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-03e/bwd_sass_counts.py main
    git apply results/cpu_2026-12-03e/bwd_spread_kq.patch   # k and q rows read with load_row_spread
    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-03e/bwd_sass_counts.py spread
    git apply -R results/cpu_2026-12-03e/bwd_spread_kq.patch

The argument only labels the rows. Written in the twenty-first session (kernels/NOTES.md).
"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

from klalm.kernels.bench_scan import BF16_ROWS, TRAINING_FLAGS
from klalm.kernels.common import BF16_PAIRS, ScanConfig, pair_unroll
from klalm.kernels.mobius_scan_bwd import _kla_bwd_kernel
from klalm.kernels.sm90 import code_counts, compile_sm90, resource_usage

OPCODES = ("SHFL", "LDS", "STS", "BAR", "FFMA", "FMUL", "SHF", "LOP3", "IMAD")
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def sass_opcodes(kernel) -> list[str]:
    """The opcode of every SASS instruction of a compiled kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(CUOBJDUMP), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    found = (re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line) for line in sass.splitlines()
             if re.match(r"\s+/\*[0-9a-f]{4}\*/", line))  # fmt: skip
    return [m[1] for m in found if m]


def main(label: str) -> None:
    print(f"| tree | bwd_block_m | rows | SASS | {' | '.join(OPCODES)} | registers | convert_layout |")
    print("| --- | ---: | --- | ---: |" + " ---: |" * (len(OPCODES) + 2))
    for block in (16, 8):
        config = ScanConfig(bwd_block_m=block)
        launch = dict(BM=block, CHUNK=config.chunk, NUM_STAGES=config.bwd_num_stages,
                      PAIR_UNROLL=pair_unroll(config.bwd_unroll))  # fmt: skip
        for rows, formats in (("fp32", {}), ("bf16", dict.fromkeys(BF16_ROWS, BF16_PAIRS.value))):
            kernel = compile_sm90(_kla_bwd_kernel, {**TRAINING_FLAGS, **launch}, formats, config.bwd_num_warps,
                                  config.bwd_num_stages)  # fmt: skip
            ops = sass_opcodes(kernel)
            counts = " | ".join(str(ops.count(op)) for op in OPCODES)
            used = resource_usage(kernel) | code_counts(kernel)
            print(f"| {label} | {block} | {rows} | {len(ops)} | {counts} | {used['registers']} | "
                  f"{used['convert_layout']} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "main")
