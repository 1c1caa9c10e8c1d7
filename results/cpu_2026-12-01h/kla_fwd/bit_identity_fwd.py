"""y, y_var, the final state and every gradient of `kla_scan_triton` under the Triton interpreter, saved for one tree
or compared bit for bit between two saved runs (results/cpu_2026-12-01g/kla_bwd/bit_identity.py, extended to the
final state, fp16 rows, decode from the prior and the log-variance path):

    TRITON_INTERPRET=1 PYTHONPATH=<shim> .venv/bin/python bit_identity_fwd.py save OUT.pt   # in each tree
    .venv/bin/python bit_identity_fwd.py compare head.pt patched.pt

Cases (B, L, M, S, initial state, segment): sequential and time-parallel (segment 32), S < S_PAD and M % BM != 0;
rows fp32, bf16 or fp16 v, k, q with fp32 Λ, and log σ² given instead of Λ (precision floor 1e-4) in fp32 or in the
rows' 16-bit dtype; y-only and y + y_var losses.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kla_bwd"))
from bit_identity import FLOOR, SHAPES, compare, draw_inputs, draw_state, record  # noqa: E402  (the same shapes and inputs)


def run():

    from klalm.kernels.common import ScanConfig
    from klalm.kernels.mobius_scan import kla_scan_triton

    out = {}
    for bi, (B, L, M, S, init, seg) in enumerate(SHAPES):
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            for logvar in (False, True):
                for var in (False, True):
                    g = torch.Generator().manual_seed(bi)
                    r = lambda *s, g=g: torch.randn(*s, generator=g)  # noqa: E731
                    x = draw_inputs(g, B, L, M, S, dt, logvar)
                    st = draw_state(g, B, M, S) if init else None
                    cfg = ScanConfig(chunk=16, segment=seg)
                    y, yv, fin = kla_scan_triton(*x.values(), initial_state=st, config=cfg, variance=var,
                                                 decode_from_prior=bi % 2 == 1,
                                                 precision_floor=FLOOR if logvar else None)  # fmt: skip
                    gy = r(*y.shape)
                    loss = (y.float() * gy).sum() + ((yv.float() * r(*yv.shape)).sum() if var else 0)
                    loss = loss + (fin.lam * r(*fin.lam.shape)).sum() + (fin.eta * r(*fin.eta.shape)).sum()
                    loss.backward()
                    key = (f"B{B}L{L}M{M}S{S}{'i' if init else ''}seg{seg}_{str(dt)[6:]}"
                           f"{'_logvar' if logvar else ''}_{'yvar' if var else 'y'}")  # fmt: skip
                    record(out, key, y, fin, x, st)
                    if var:
                        out[key + "/y_var"] = yv.detach()
    return out


if __name__ == "__main__":
    torch.save(run(), sys.argv[2]) if sys.argv[1] == "save" else compare(sys.argv[2], sys.argv[3])
