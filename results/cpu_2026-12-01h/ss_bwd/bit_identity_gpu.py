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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01g" / "ss"))
from bit_identity import CASES, run  # noqa: E402

from klalm.kernels import selective_scan as ss  # noqa: E402

# and the default config on whole chunks and channel blocks (the benchmark's case), bf16 and fp32 rows
CASES = CASES + [(2, 128, 32, 16, torch.bfloat16, True, False, ss.DEFAULT_CONFIG),
                 (2, 128, 32, 16, None, True, False, ss.DEFAULT_CONFIG)]  # fmt: skip


def save(path: str) -> None:
    torch.save(run(CASES, "cuda"), path)


if __name__ == "__main__":
    save(sys.argv[2]) if sys.argv[1] == "save" else sys.exit("usage: bit_identity_gpu.py save OUT.pt")
