"""Eager forward + backward time of klalm's torch GDN path on the CPU, by chunk count, at fixed heads and widths
(B 2, H 8, K 48, V 96, float32, chunks of 64; median of 5 calls after one warm-up). Run on each tree of an A/B:

    .venv/bin/python results/cpu_2026-12-04c/gdn_loop_time.py
"""

import time

import torch

from klalm.ops.gdn import gated_delta_rule_torch


def inputs(length: int, batch: int = 2, heads: int = 8, dk: int = 48, dv: int = 96) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    unit = lambda: torch.nn.functional.normalize(torch.randn(batch, length, heads, dk, generator=gen), dim=-1)  # noqa: E731
    gates = [-torch.rand(batch, length, heads, generator=gen), torch.rand(batch, length, heads, generator=gen)]
    raw = [unit(), unit(), torch.randn(batch, length, heads, dv, generator=gen), *gates]
    return [t.requires_grad_() for t in raw]


def main() -> None:
    print("| T | chunks of 64 | forward ms | forward + backward ms (median of 5) |")
    print("| ---: | ---: | ---: | ---: |")
    for length in (512, 1024, 2048, 4096):
        x = inputs(length)
        fwd, both = [], []
        for _ in range(6):
            start = time.perf_counter()
            out = gated_delta_rule_torch(*x, None, 0.25)[0]
            mid = time.perf_counter()
            out.square().sum().backward()
            end = time.perf_counter()
            fwd.append(1e3 * (mid - start))
            both.append(1e3 * (end - start))
        fwd, both = sorted(fwd[1:]), sorted(both[1:])
        print(f"| {length} | {length // 64} | {fwd[2]:.1f} | {both[2]:.1f} |")
    print(f"\nB 2, H 8, K 48, V 96, float32; torch {torch.__version__}, {torch.get_num_threads()} CPU threads")


if __name__ == "__main__":
    main()
