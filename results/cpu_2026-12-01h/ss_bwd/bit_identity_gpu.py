"""results/cpu_2026-12-01g/ss/bit_identity.py on the GPU: the same cases (inputs drawn on the CPU with the same
seeds), run by the compiled kernels on cuda; outputs and gradients saved on the CPU for `compare`. The interpreter
checks the kernels' arithmetic as Triton defines it; this checks what ptxas made of it (contraction into FMAs, a
register cap), which the interpreter cannot see.

    .venv/bin/python results/cpu_2026-12-01h/ss_bwd/bit_identity_gpu.py save main_gpu.pt      # in each tree
    .venv/bin/python results/cpu_2026-12-01g/ss/bit_identity.py compare main_gpu.pt patched_gpu.pt
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01g" / "ss"))
from bit_identity import CASES  # noqa: E402

from klalm.kernels import selective_scan as ss  # noqa: E402

# and the default config on whole chunks and channel blocks (the benchmark's case), bf16 and fp32 rows
CASES = CASES + [(2, 128, 32, 16, torch.bfloat16, True, False, ss.DEFAULT_CONFIG),
                 (2, 128, 32, 16, None, True, False, ss.DEFAULT_CONFIG)]  # fmt: skip


def save(path: str) -> None:
    print("kernels of", ss.__file__, file=sys.stderr)  # which tree ran
    out = {}
    for i, (b, length, m, n, narrow, has_d, has_h0, cfg) in enumerate(CASES):
        g = torch.Generator().manual_seed(i)
        r = lambda *s, g=g: torch.randn(*s, generator=g)  # noqa: E731
        x = [r(b, length, m), F.softplus(r(b, length, m) - 1), -torch.exp(0.5 * r(m, n)), r(b, length, n),
             r(b, length, n), r(m) if has_d else None, r(b, m, n) if has_h0 else None]  # fmt: skip
        if narrow is not None:
            for k in (0, 3, 4):
                x[k] = x[k].to(narrow)
        x = [t.cuda() if t is not None else None for t in x]
        leaves = [t.clone().requires_grad_() if t is not None else None for t in x]
        y, h = ss.selective_scan_triton(*leaves, config=cfg)
        gy, gh = torch.randn(y.shape, generator=g).to(y.dtype).cuda(), torch.randn(h.shape, generator=g).cuda()
        torch.autograd.backward([y, h], [gy, gh])
        out[i] = [y.detach(), h.detach()] + [t.grad for t in leaves if t is not None]
        leaves2 = [t.clone().requires_grad_() if t is not None else None for t in x]
        y2, _ = ss.selective_scan_triton(*leaves2, config=cfg)
        y2.backward(gy)
        out[i] += [t.grad for t in leaves2 if t is not None]
        out[i] = [t.cpu() for t in out[i]]
    torch.save(out, path)


if __name__ == "__main__":
    save(sys.argv[2]) if sys.argv[1] == "save" else sys.exit("usage: bit_identity_gpu.py save OUT.pt")
