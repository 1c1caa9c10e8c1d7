"""GPU: the selective scan's training step (forward + backward of y) with bf16 u, B, C (what a Mamba layer passes
under autocast) for launch configs around its default, against the default with fp32 rows. The target of issue 17:
16-bit inputs at least as fast as fp32; the fifteenth session measured bf16 f+b 2.893–2.895 ms against fp32's
2.814–2.821 (1.03×) at this shape (B16 L2048 M1024 N16). If a config makes bf16 rows at least as fast as fp32 ones
without slowing fp32, the selective scan's default can take it (for 16-bit rows, or for all). ss_registers.md beside
this file has what each config's backward compiles to offline (Triton 3.6, sm_90): bf16 rows cost the default 22 %
more PTX instructions (1,495 against 1,225) at the same 128 registers. The default rows run
first and again last, to show the drift between timings. Prints one Markdown table. From the repository root, on the
GPU (about a minute):

    source scripts/device_setup.sh && python3 results/cpu_2026-12-03b/ss_bf16_pick.py

Under TRITON_INTERPRET=1 (CPU) it runs at a tiny shape, to check the script, not the kernels' speed.
"""

import torch

from klalm.kernels.bench_scan import DTYPE_SHAPE, compiled_kernels, new_kernels, registers, ss_runners, timed_ms
from klalm.kernels.common import interpreting
from klalm.kernels.selective_scan import DEFAULT_CONFIG, _ss_bwd_kernel, _ss_fwd_kernel

SHAPE = dict(batch=1, length=64, channels=16, state=16) if interpreting() else DTYPE_SHAPE
D = DEFAULT_CONFIG
CANDIDATES = {  # name -> config (the changes from the default)
    "bwd_num_stages 2": D._replace(bwd_num_stages=2),
    "bwd_num_stages 4": D._replace(bwd_num_stages=4),
    "bwd_unroll 4": D._replace(bwd_unroll=4),
    "bwd_block_m 16": D._replace(bwd_block_m=16),
    "bwd_block_m 16, 2 warps": D._replace(bwd_block_m=16, bwd_num_warps=2),
    "bwd_block_m 4": D._replace(bwd_block_m=4),
    "chunk 32": D._replace(chunk=32),
    "chunk 128": D._replace(chunk=128),
}
ROWS = [
    ("fp32", "default", D),
    ("bf16", "default", D),
    *(("bf16", name, config) for name, config in CANDIDATES.items()),
    ("fp32", "default, again", D),
    ("bf16", "default, again", D),
]


def main() -> None:
    print(f"shape B{SHAPE['batch']} L{SHAPE['length']} M{SHAPE['channels']} N{SHAPE['state']}; default {tuple(D)}")
    print("| u, B, C | config | fwd ms | f+b(y) ms | bwd regs, spills |")
    print("| --- | --- | ---: | ---: | --- |", flush=True)
    for dtype_name, name, config in ROWS:
        runners = ss_runners("triton", SHAPE, config, narrow=torch.bfloat16 if dtype_name == "bf16" else None)
        known = compiled_kernels(_ss_fwd_kernel) | compiled_kernels(_ss_bwd_kernel)
        fwd = timed_ms(runners["fwd"])
        fwd_bwd = timed_ms(runners["fwd+bwd (y)"])
        print(f"| {dtype_name} | {name} | {fwd} | {fwd_bwd} | {registers(new_kernels(_ss_bwd_kernel, known))} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
