"""The KLA scan's training step (forward + backward of y, bf16 v, k, q as the layer passes them) at MQAR's long cell
(B256 L2048, M256 = one d_model-128 block at expand 2) for d_state S 16, 32 and 64, at the default ScanConfig and at
smaller channel blocks / more warps: why the d_state-64 MQAR unit ran at 247 ms a step against 25 ms at 16, and
which launch config would fix it. Prints one Markdown table (registers and spills of the backward kernel)."""

import torch

from klalm.kernels.bench_scan import (
    LAYER_NARROW,
    _narrow,
    compiled_kernels,
    kla_inputs,
    new_kernels,
    registers,
    scan_runners,
    timed_ms,
)
from klalm.kernels.common import ScanConfig
from klalm.kernels.mobius_scan_bwd import _kla_bwd_kernel

CONFIGS = {
    "default": ScanConfig(),
    "bm 16, bwd_bm 8": ScanConfig(block_m=16, bwd_block_m=8),
    "bm 8, bwd_bm 4": ScanConfig(block_m=8, bwd_block_m=4),
    "bm 4, bwd_bm 2": ScanConfig(block_m=4, bwd_block_m=2),
    "warps 4 / 4": ScanConfig(num_warps=4, bwd_num_warps=4),
    "bm 16 / 8, warps 2 / 2": ScanConfig(block_m=16, bwd_block_m=8, num_warps=2, bwd_num_warps=2),
}
print("| S | config | fwd ms | f+b(y) ms | bwd regs, spills |")
print("| ---: | --- | ---: | ---: | --- |", flush=True)
for state in (16, 32, 64):
    inputs = _narrow(kla_inputs(batch=256, length=2048, channels=256, state=state), torch.bfloat16, LAYER_NARROW)
    for name, config in CONFIGS.items():
        if state == 16 and name != "default":
            continue
        runners = scan_runners("triton", inputs, config, variance=False)
        fwd = timed_ms(runners["fwd"])
        known = compiled_kernels(_kla_bwd_kernel)
        ms = timed_ms(runners["fwd+bwd (y)"])
        print(f"| {state} | {name} | {fwd} | {ms} | {registers(new_kernels(_kla_bwd_kernel, known))} |", flush=True)
    del inputs
    torch.cuda.empty_cache()
