"""GPU, for the next session (about two minutes): the two measurements the nineteenth session left (kernels/NOTES.md,
"Measurements still to take", items 2 and 3).

1. The merged sliced KLA scan at MQAR's capacity-unit layer (B256 L2048 M256 S64, bf16 v, k, q, forward+backward of
   y): `default_config(64)` (four S-16 scans inside the custom ops, float32 partial outputs) against the whole scan
   on the old default (block_m 8, bwd_block_m 4), whole again (the drift).
2. The selective scan's bwd_block_m 16 over the length sweep of `bench_scan.py --lengths` (16,384 tokens per call,
   M1536 N16, the automatic time-parallel split), fp32 and bf16 u, B, C, against the default: does it keep the
   per-token spread and B1 L16384 where the default has them? If it is no slower anywhere it becomes the default.

From the repository root, on the GPU: `source scripts/device_setup.sh && python3 results/cpu_2026-12-03c/next_gpu.py`.
Under TRITON_INTERPRET=1 (CPU) it runs at tiny shapes, to check the script, not the speed.
"""

import torch

from klalm.kernels.bench_scan import (LAYER_NARROW, LENGTHS, LENGTHS_TOKENS, WIDE, _narrow, kla_inputs,
                                      per_token_ns, scan_runners, ss_runners, timed_ms)  # fmt: skip
from klalm.kernels.common import ScanConfig, interpreting
from klalm.kernels.mobius_scan import default_config
from klalm.kernels.selective_scan import DEFAULT_CONFIG as SS_DEFAULT

CAPACITY = dict(batch=256, length=2048, channels=256, state=64)
LENGTHS_, TOKENS, WIDTH = LENGTHS, LENGTHS_TOKENS, WIDE
if interpreting():
    CAPACITY = dict(batch=1, length=40, channels=8, state=64)
    LENGTHS_, TOKENS, WIDTH = (16, 32), 32, dict(channels=8, state=16)
WHOLE_64 = ScanConfig(block_m=8, bwd_block_m=4)  # the S-64 default before the nineteenth session
SS_CONFIGS = {"default": SS_DEFAULT, "bwd_block_m 16": SS_DEFAULT._replace(bwd_block_m=16)}


def sliced_against_whole() -> None:
    inputs = _narrow(kla_inputs(**CAPACITY), torch.bfloat16, LAYER_NARROW)
    print("B{batch} L{length} M{channels} S{state}, bf16 v, k, q".format(**CAPACITY))
    print("| scan | config | f+b(y) ms |\n| --- | --- | ---: |", flush=True)
    for label, config in (("whole", WHOLE_64), ("4 slices of 16", default_config(64)), ("whole, again", WHOLE_64)):
        ms = timed_ms(scan_runners("triton", inputs, config, variance=False)["fwd+bwd (y)"])
        print(f"| {label} | {tuple(config)} | {ms} |", flush=True)


def ss_lengths() -> None:
    print(f"\nSelective scan, {TOKENS} tokens per call, M{WIDTH['channels']} N{WIDTH['state']}, automatic split")
    print("| L | B | rows | " + " | ".join(f"{name} f+b(y) ms, ns/tok" for name in SS_CONFIGS) + " |")
    print("| ---: | ---: | --- |" + " ---: |" * len(SS_CONFIGS), flush=True)
    for length in LENGTHS_:
        batch = max(1, TOKENS // length)
        shape = dict(batch=batch, length=length, **WIDTH)
        for rows, narrow in (("fp32", None), ("bf16", torch.bfloat16)):
            cells = []
            for config in SS_CONFIGS.values():
                ms = timed_ms(ss_runners("triton", shape, config, narrow=narrow)["fwd+bwd (y)"])
                cells.append(f"{ms}, {per_token_ns(ms, batch * length)}")
            print(f"| {length} | {batch} | {rows} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    sliced_against_whole()
    ss_lengths()
