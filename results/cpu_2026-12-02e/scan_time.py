"""The training step (forward + backward of y, as the layers train) of both scans at the 45M layers' shape, B16 L2048
M1024 with S = N = 16: the KLA scan with float32 rows and with the KLA layer's (bf16 v, k, q; float32 Λ), the
selective scan with float32 rows and the Mamba layer's (bf16 u, B, C), the latter at its default config and at
`bwd_unroll` 2; with the registers and spills of the backward kernels each row launched. For timing this folder's
patches against main on a GPU (kernels_call.sh); prints one Markdown table, labelled with argv[1]."""

import sys

import torch

from klalm.kernels.bench_scan import (
    DTYPE_SHAPE,
    LAYER_NARROW,
    _narrow,
    compiled_kernels,
    kla_inputs,
    new_kernels,
    registers,
    scan_runners,
    ss_runners,
    timed_ms,
)
from klalm.kernels.mobius_scan_bwd import _kla_bwd_kernel
from klalm.kernels.selective_scan import DEFAULT_CONFIG, _ss_bwd_kernel

label = sys.argv[1] if len(sys.argv) > 1 else "tree"
print("| tree | scan | rows | config | f+b(y) ms | bwd regs, spills |")
print("| --- | --- | --- | --- | ---: | --- |", flush=True)


def timed_row(scan: str, rows_name: str, config_name: str, runners: dict, kernel) -> None:
    """Prints the row as soon as it is measured (a call cut by its time limit keeps the rows before)."""
    runners["fwd"]()  # compile the forward first, so the kernels listed below are the backward's
    known = compiled_kernels(kernel)
    ms = timed_ms(runners["fwd+bwd (y)"])
    regs = registers(new_kernels(kernel, known))
    print(f"| {label} | {scan} | {rows_name} | {config_name} | {ms} | {regs} |", flush=True)


f32 = kla_inputs(**DTYPE_SHAPE)
for rows_name, inputs in (("fp32", f32), ("bf16 v, k, q; fp32 Λ", _narrow(f32, torch.bfloat16, LAYER_NARROW))):
    timed_row("KLA", rows_name, "default", scan_runners("triton", inputs, None, variance=False), _kla_bwd_kernel)
for narrow, rows_name in ((None, "fp32"), (torch.bfloat16, "bf16 u, B, C")):
    for config in (DEFAULT_CONFIG, DEFAULT_CONFIG._replace(bwd_unroll=2)):
        runners = ss_runners("triton", DTYPE_SHAPE, config=config, narrow=narrow)
        timed_row("selective", rows_name, f"bwd_unroll {config.bwd_unroll}", runners, _ss_bwd_kernel)
