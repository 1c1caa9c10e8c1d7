"""Outputs and gradients of `selective_scan_triton` on small shapes under the Triton interpreter, saved or compared
bit for bit: run `save` in a checkout of each tree, then `compare`.

    TRITON_INTERPRET=1 .venv/bin/python results/cpu_2026-12-01g/ss/bit_identity.py save main.pt   # each tree
    .venv/bin/python results/cpu_2026-12-01g/ss/bit_identity.py compare main.pt patched.pt

Cases: fp32, bf16 and fp16 u, B, C; sequential and time-parallel (segment 8); with and without D and h0; a tiny
config and the default one at chunk 16. Each saves y, h and every input's gradient, for a backward through (y, h)
and through y alone.
"""

import sys

import torch
import torch.nn.functional as F

from klalm.kernels import selective_scan as ss
from klalm.kernels.common import ScanConfig

TINY = ScanConfig(block_m=4, chunk=4, num_stages=2, unroll=2, bwd_block_m=8, bwd_num_stages=2, bwd_unroll=2)
CASES = [  # (B, L, M, N, narrow dtype for u/B/C, D, h0, config)
    (2, 13, 8, 5, None, True, True, TINY),
    (1, 21, 16, 4, None, True, False, TINY._replace(segment=8)),
    (2, 13, 8, 6, torch.bfloat16, True, True, TINY),
    (1, 21, 16, 4, torch.bfloat16, True, False, TINY._replace(segment=8)),
    (1, 40, 16, 16, torch.bfloat16, True, False, ss.DEFAULT_CONFIG._replace(chunk=16)),
    (1, 40, 16, 16, None, False, False, ss.DEFAULT_CONFIG._replace(chunk=16)),
    (1, 18, 8, 4, torch.float16, True, True, TINY),
]


def run(cases=CASES, device: str = "cpu") -> dict[int, list[torch.Tensor]]:
    """Each case's outputs and gradients (on the CPU), its inputs drawn on the CPU from seed i and run on `device`."""
    print("kernels of", ss.__file__, file=sys.stderr)  # which tree ran
    out = {}
    for i, (b, length, m, n, narrow, has_d, has_h0, cfg) in enumerate(cases):
        g = torch.Generator().manual_seed(i)
        r = lambda *s, g=g: torch.randn(*s, generator=g)  # noqa: E731
        x = [
            r(b, length, m),
            F.softplus(r(b, length, m) - 1),
            -torch.exp(0.5 * r(m, n)),
            r(b, length, n),
            r(b, length, n),
            r(m) if has_d else None,
            r(b, m, n) if has_h0 else None,
        ]
        if narrow is not None:
            for k in (0, 3, 4):
                x[k] = x[k].to(narrow)
        x = [t.to(device) if t is not None else None for t in x]
        leaves = [t.clone().requires_grad_() if t is not None else None for t in x]
        y, h = ss.selective_scan_triton(*leaves, config=cfg)
        gy = torch.randn(y.shape, generator=g).to(y.dtype).to(device)
        gh = torch.randn(h.shape, generator=g).to(device)
        torch.autograd.backward([y, h], [gy, gh])
        out[i] = [y.detach(), h.detach()] + [t.grad for t in leaves if t is not None]
        # y-only backward (final state without gradient: gh None path)
        leaves2 = [t.clone().requires_grad_() if t is not None else None for t in x]
        y2, _ = ss.selective_scan_triton(*leaves2, config=cfg)
        y2.backward(gy)
        out[i] += [t.grad for t in leaves2 if t is not None]
        out[i] = [t.cpu() for t in out[i]]
    return out


def save(path: str) -> None:
    torch.save(run(), path)


def compare(path_a: str, path_b: str) -> None:
    a, b = torch.load(path_a), torch.load(path_b)
    bad = 0
    for k in a:
        same = [torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a[k], b[k])]
        bad += not all(same)
        print(f"case {k}: {sum(same)}/{len(same)} tensors bit-identical", "" if all(same) else same)
    print("ALL BIT-IDENTICAL" if not bad else f"{bad} cases differ")


if __name__ == "__main__":
    save(sys.argv[2]) if sys.argv[1] == "save" else compare(sys.argv[2], sys.argv[3])
