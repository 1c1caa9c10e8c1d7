"""Bytes autograd saves for the backward of one call of klalm's torch GDN path (saved_tensors_hooks, each storage
counted once), by chunk count; run on each tree of an A/B (results/cpu_2026-12-04c/README.md):

    .venv/bin/python results/cpu_2026-12-04c/gdn_saved_bytes.py
"""

import torch

from klalm.ops.gdn import gated_delta_rule_torch


def saved_bytes(length: int, batch: int = 2, heads: int = 8, dk: int = 48, dv: int = 96) -> int:
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(batch, length, heads, dk, generator=gen), dim=-1) for _ in "qk")
    v = torch.randn(batch, length, heads, dv, generator=gen)
    g, beta = -torch.rand(batch, length, heads, generator=gen), torch.rand(batch, length, heads, generator=gen)
    inputs = [x.requires_grad_() for x in (q, k, v, g, beta)]
    storages = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        gated_delta_rule_torch(*inputs, None, 0.25)
    inputs_bytes = sum(x.untyped_storage().nbytes() for x in inputs)
    return sum(storages.values()) - inputs_bytes


def main() -> None:
    print("| T | chunks of 64 | saved for backward, MB (inputs excluded) | per state-sized [B, H, N, K, V] tensor |")
    print("| ---: | ---: | ---: | ---: |")
    for length in (512, 2048, 4096):
        n = saved_bytes(length)
        state = 2 * 8 * (length // 64) * 48 * 96 * 4
        print(f"| {length} | {length // 64} | {n / 1e6:.1f} | {n / state:.1f} |")
    print("\nB 2, H 8, K 48, V 96, float32")


if __name__ == "__main__":
    main()
