"""`../../cpu_2026-12-01h/kla_bwd/bit_identity.py` with two more shapes whose chunks end on an odd number of steps
(the half-scratch backward walks a chunk in pairs of steps and takes an odd chunk's last step alone): L 37 (chunks
16, 16, 5) with an initial state, and L 45 with the time-parallel split (segments of 32 steps: chunks 16, 16 | 13).

    TRITON_INTERPRET=1 .venv/bin/python results/cpu_2026-12-02/kla_bwd_half_scratch/bit_identity_half.py save OUT.pt
    .venv/bin/python results/cpu_2026-12-02/kla_bwd_half_scratch/bit_identity_half.py compare head.pt patched.pt
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01h" / "kla_bwd"))
import bit_identity as bi  # noqa: E402

bi.SHAPES = bi.SHAPES + [(1, 37, 16, 16, True, 0), (2, 45, 20, 3, False, 32)]

if __name__ == "__main__":
    torch.save(bi.run(), sys.argv[2]) if sys.argv[1] == "save" else bi.compare(sys.argv[2], sys.argv[3])
