"""GPU: the KLA scan's training step (forward + backward of y, bf16 v, k, q as the layer passes them under autocast)
at MQAR's long cell with d_state 64 (B256 L2048 M256 S64: the capacity unit's layer) for the launch configs that
compile without spilling (or nearly) for sm_90 in s64_registers.md, against today's default for S 64 (block_m 8,
bwd_block_m 4, one warp each: forward 10.09 ms, f+b 52.58 ms in results/gpu_2026-12-02f/dstate_pick.md). Prints one
Markdown table. From the repository root, on the GPU:

    source scripts/device_setup.sh && python3 results/cpu_2026-12-03/s64_pick.py
"""

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
from klalm.kernels.mobius_scan import default_config
from klalm.kernels.mobius_scan_bwd import _kla_bwd_kernel
from klalm.kernels.mobius_scan_fwd import _kla_fwd_kernel

DEFAULT = default_config(64)
CONFIGS = {
    "default (bm 8, bwd_bm 4)": DEFAULT,
    "fwd bm 16, warps 4": DEFAULT._replace(block_m=16, num_warps=4),
    "fwd bm 32, warps 4": DEFAULT._replace(block_m=32, num_warps=4),
    "fwd bm 8, warps 2": DEFAULT._replace(num_warps=2),
    "bwd bm 8, warps 2": DEFAULT._replace(bwd_block_m=8, bwd_num_warps=2),
    "fwd bm 16 w4, bwd bm 8 w2": DEFAULT._replace(block_m=16, num_warps=4, bwd_block_m=8, bwd_num_warps=2),
}
assert isinstance(DEFAULT, ScanConfig)
print("| config | fwd ms | fwd regs, spills | f+b(y) ms | bwd regs, spills |")
print("| --- | ---: | --- | ---: | --- |", flush=True)
inputs = _narrow(kla_inputs(batch=256, length=2048, channels=256, state=64), torch.bfloat16, LAYER_NARROW)
for name, config in CONFIGS.items():
    runners = scan_runners("triton", inputs, config, variance=False)
    known = compiled_kernels(_kla_fwd_kernel) | compiled_kernels(_kla_bwd_kernel)
    fwd = timed_ms(runners["fwd"])
    fwd_regs = registers(new_kernels(_kla_fwd_kernel, known))
    known |= compiled_kernels(_kla_fwd_kernel)
    ms = timed_ms(runners["fwd+bwd (y)"])
    print(f"| {name} | {fwd} | {fwd_regs} | {ms} | {registers(new_kernels(_kla_bwd_kernel, known))} |", flush=True)
