"""GPU, for the next session (about a minute): the selective scan's bwd_block_m 16 over the length sweep of
`bench_scan.py --lengths` (16,384 tokens per call, M1536 N16, the automatic time-parallel split), fp32 and bf16 u, B,
C, against the default. At B16 L2048 M1024 N16 it was 3 % faster for both row types and brought bf16 to 1.01× fp32
(results/gpu_2026-12-03c/ss_bm16.md), but it halves the backward's programs: does it keep the per-token spread and
B1 L16384 where the default has them? If it is no slower anywhere it becomes the default.

From the repository root, on the GPU: `source scripts/device_setup.sh && python3
results/cpu_2026-12-03c/ss_bm16_lengths.py`. Under TRITON_INTERPRET=1 (CPU, with bench_scan's DEVICE and `timed`
swapped as tests/kernels/test_bench_scan.py does) it runs at tiny shapes, to check the script, not the speed.
"""

import torch

from klalm.kernels.bench_scan import LENGTHS, LENGTHS_TOKENS, WIDE, per_token_ns, ss_runners, timed_ms
from klalm.kernels.common import interpreting
from klalm.kernels.selective_scan import DEFAULT_CONFIG as SS_DEFAULT

LENGTHS_, TOKENS, WIDTH = LENGTHS, LENGTHS_TOKENS, WIDE
if interpreting():
    LENGTHS_, TOKENS, WIDTH = (16, 32), 32, dict(channels=8, state=16)
SS_CONFIGS = {"default": SS_DEFAULT, "bwd_block_m 16": SS_DEFAULT._replace(bwd_block_m=16)}


def ss_lengths() -> None:
    print(f"Selective scan, {TOKENS} tokens per call, M{WIDTH['channels']} N{WIDTH['state']}, automatic split")
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
    ss_lengths()
