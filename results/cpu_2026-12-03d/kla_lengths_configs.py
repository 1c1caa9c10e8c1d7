"""GPU, for the next session (about two minutes): the KLA scan's launch config over the length sweep of
`bench_scan.py --lengths` (16,384 tokens per call, M1536 S16, the automatic time-parallel split from L 4,096 on),
with the KLA layer's bf16 v, k, q and with fp32 rows: the default (block_m 32, bwd_block_m 16) against half the
backward's channel block (bwd_block_m 8), half the forward's (block_m 16) and both. The selective scan's backward
was 0.86-0.97x faster with half its block wherever the split runs (results/gpu_2026-12-03d); the KLA scan's
per-token spread (1.44x, against the 1.3x target) is its longest lengths' (154-183 ns a token from L 1,024 on
against 127 at L 512). If one config is faster at every split length, it becomes the split's default (as
`selective_scan.default_config` does).

From the repository root, on the GPU: `source scripts/device_setup.sh && python3
results/cpu_2026-12-03d/kla_lengths_configs.py`. Under TRITON_INTERPRET=1 it runs on the CPU at tiny shapes, each
timing one call reported as 1 ms (bench_scan's DEVICE and `timed` swapped as tests/kernels/test_bench_scan.py does),
to check the script, not the speed.
"""

import torch

from klalm.kernels import bench_scan
from klalm.kernels.bench_scan import LAYER_NARROW, LENGTHS, LENGTHS_TOKENS, WIDE, per_token_ns, scan_runners, timed_ms
from klalm.kernels.common import interpreting
from klalm.kernels.mobius_scan import DEFAULT_CONFIG

LENGTHS_, TOKENS, WIDTH = LENGTHS, LENGTHS_TOKENS, WIDE
if interpreting():
    LENGTHS_, TOKENS, WIDTH = (16, 32), 32, dict(channels=8, state=4)
CONFIGS = {
    "default": DEFAULT_CONFIG,
    "bwd_block_m 8": DEFAULT_CONFIG._replace(bwd_block_m=8),
    "block_m 16": DEFAULT_CONFIG._replace(block_m=16),
    "both": DEFAULT_CONFIG._replace(block_m=16, bwd_block_m=8),
}


def kla_lengths() -> None:
    print(f"KLA scan, {TOKENS} tokens per call, M{WIDTH['channels']} S{WIDTH['state']}, automatic split")
    print("| L | B | rows | " + " | ".join(f"{name} f+b(y) ms, ns/tok" for name in CONFIGS) + " |")
    print("| ---: | ---: | --- |" + " ---: |" * len(CONFIGS), flush=True)
    for length in LENGTHS_:
        batch = max(1, TOKENS // length)
        inputs = bench_scan.kla_inputs(batch, length, **WIDTH)
        for rows, narrow in (("fp32", inputs), ("bf16", bench_scan._narrow(inputs, torch.bfloat16, LAYER_NARROW))):
            cells = []
            for config in CONFIGS.values():
                ms = timed_ms(scan_runners("triton", narrow, config, variance=False)["fwd+bwd (y)"])
                cells.append(f"{ms}, {per_token_ns(ms, batch * length)}")
            print(f"| {length} | {batch} | {rows} | " + " | ".join(cells) + " |", flush=True)
        del inputs


if __name__ == "__main__":
    if interpreting():
        bench_scan.DEVICE, bench_scan.timed = "cpu", lambda fn: (fn(), (1.0, 0.0))[1]
    kla_lengths()
