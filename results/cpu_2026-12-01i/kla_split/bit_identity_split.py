"""y, the final state and every gradient of `kla_scan_triton` under the Triton interpreter at small shapes that all
take the time-parallel split (so the forward and backward summary and carry kernels run), saved for one tree or
compared bit for bit between two saved runs. Inputs and the comparison are those of
../../cpu_2026-12-01h/kla_bwd/bit_identity.py (imported, not copied).

    TRITON_INTERPRET=1 .venv/bin/python results/cpu_2026-12-01i/kla_split/bit_identity_split.py save OUT.pt  # each tree
    .venv/bin/python results/cpu_2026-12-01i/kla_split/bit_identity_split.py compare head.pt patched.pt
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01h" / "kla_bwd"))
from bit_identity import FLOOR, compare, draw_inputs, draw_state, record  # noqa: E402

# (B, L, M, S, initial state); chunk 16, segment 32 (2 chunks): 3 or 4 segments, the last one partial at L = 88.
# Whole rows (EVEN_S, EVEN_M in both directions); M % 32 != 0 with M % 16 == 0 (the forward's rows masked, the
# backward's whole) and an initial state; S < S_PAD and M % 16 != 0 (every row masked)
SHAPES = [(1, 96, 32, 16, False), (2, 88, 48, 16, True), (2, 64, 20, 3, False)]
CASES = [  # (dtype of v, k, q (and log σ²), y_var in the loss, log σ² in, decode from the prior)
    (torch.float32, False, False, False),
    (torch.bfloat16, False, False, False),
    (torch.float16, True, False, False),
    (torch.float32, True, True, False),
    (torch.bfloat16, False, True, False),
    (torch.bfloat16, True, False, True),
]


def run() -> dict:
    from klalm.kernels.common import ScanConfig
    from klalm.kernels.mobius_scan import kla_scan_triton

    out = {}
    for bi, (B, L, M, S, init) in enumerate(SHAPES):
        for dt, var, logvar, prior in CASES:
            g = torch.Generator().manual_seed(bi)
            r = lambda *s, g=g: torch.randn(*s, generator=g)  # noqa: E731
            x = draw_inputs(g, B, L, M, S, dt, logvar)
            st = draw_state(g, B, M, S) if init else None
            y, yv, fin = kla_scan_triton(
                *x.values(), initial_state=st, decode_from_prior=prior, config=ScanConfig(chunk=16, segment=32),
                variance=var, precision_floor=FLOOR if logvar else None,
            )  # fmt: skip
            loss = (y.float() * r(*y.shape)).sum() + ((yv * r(*yv.shape)).sum() if var else 0)
            if bi % 2:  # a loss on the final state too (the carry kernels' HAS_GSTATE path)
                loss = loss + (fin.lam * r(*fin.lam.shape)).sum() + (fin.eta * r(*fin.eta.shape)).sum()
            loss.backward()
            key = (f"B{B}L{L}M{M}S{S}{'i' if init else ''}_{str(dt)[6:]}_{'yvar' if var else 'y'}"
                   f"{'_logvar' if logvar else ''}{'_prior' if prior else ''}")  # fmt: skip
            record(out, key, y, fin, x, st)
            print(key, flush=True)
    return out


if __name__ == "__main__":
    torch.save(run(), sys.argv[2]) if sys.argv[1] == "save" else compare(sys.argv[2], sys.argv[3])
