"""The selective scan's training step (forward + backward of y, as the Mamba layer trains) at the mamba_45m layer's
shape, B16 L2048 M1024 N16, with float32 and bf16 rows, at the default config and at `bwd_unroll` 2; with the
registers and spills of the backward kernels each row launched. For timing `ss_bwd_half_scratch.patch` against
main on a GPU (ss_call.sh); prints one Markdown table, labelled with argv[1]."""

import sys

import torch

from klalm.kernels.bench_scan import DTYPE_SHAPE, compiled_kernels, new_kernels, registers, ss_runners, timed_ms
from klalm.kernels.selective_scan import DEFAULT_CONFIG, _ss_bwd_kernel

label = sys.argv[1] if len(sys.argv) > 1 else "tree"
rows = []
for narrow, rows_name in ((None, "fp32"), (torch.bfloat16, "bf16 u, B, C")):
    for config in (DEFAULT_CONFIG, DEFAULT_CONFIG._replace(bwd_unroll=2)):
        runners = ss_runners("triton", DTYPE_SHAPE, config=config, narrow=narrow)
        runners["fwd"]()  # compile the forward first, so the kernels listed below are the backward's
        known = compiled_kernels(_ss_bwd_kernel)
        ms = timed_ms(runners["fwd+bwd (y)"])
        regs = registers(new_kernels(_ss_bwd_kernel, known))
        rows.append(f"| {label} | {rows_name} | {config.bwd_unroll} | {ms} | {regs} |")
print("| tree | rows | bwd_unroll | f+b(y) ms | bwd regs, spills |\n| --- | --- | ---: | ---: | --- |")
print("\n".join(rows), flush=True)
