"""y and every gradient of `kla_scan_triton` under the Triton interpreter, saved for one tree or compared bit for bit
between two saved runs: run `save` in a checkout of each tree, then `compare`.

    TRITON_INTERPRET=1 .venv/bin/python results/cpu_2026-12-01g/kla_bwd/bit_identity.py save head.pt   # each tree
    .venv/bin/python results/cpu_2026-12-01g/kla_bwd/bit_identity.py compare head.pt patched.pt

Shapes (B, L, M, S): fp32 and bf16 v, k, q rows (fp32 Λ), y-only and y + y_var losses, one with an initial state
and the time-parallel split, one with S < S_PAD and M % BM != 0 (the masked paths).
"""

import sys

import torch

SHAPES = [(2, 70, 32, 16, False, 0), (1, 96, 16, 4, True, 32), (2, 40, 20, 3, False, 0), (1, 64, 48, 16, True, 32)]


def run():
    import torch.nn.functional as F

    from klalm.kernels.common import ScanConfig
    from klalm.kernels.mobius_scan import kla_scan_triton
    from klalm.ops.common import KLAState

    out = {}
    for bi, (B, L, M, S, init, seg) in enumerate(SHAPES):
        for dt in (torch.float32, torch.bfloat16):
            for var in (False, True):
                g = torch.Generator().manual_seed(bi)
                r = lambda *s, g=g: torch.randn(*s, generator=g)  # noqa: E731
                x = dict(
                    v=r(B, L, M),
                    lambda_v=1.0 / (F.softplus(r(B, L, M)) + 1e-4),
                    k=F.normalize(r(B, L, S), dim=-1),
                    q=F.normalize(r(B, L, S), dim=-1),
                    a=torch.exp(-F.softplus(r(M, S)) * 0.5),
                    p=F.softplus(r(M, S)) * 0.05,
                )
                for n in ("v", "k", "q"):
                    x[n] = x[n].to(dt)
                x = {n: t.requires_grad_() for n, t in x.items()}
                st = KLAState(0.5 + torch.rand(B, M, S, generator=g), r(B, M, S)) if init else None
                if st is not None:
                    st = KLAState(st.lam.requires_grad_(), st.eta.requires_grad_())
                cfg = ScanConfig(chunk=16, segment=seg)
                y, yv, fin = kla_scan_triton(*x.values(), initial_state=st, config=cfg, variance=var)
                gy = r(*y.shape)
                loss = (y.float() * gy).sum() + ((yv * r(*yv.shape)).sum() if var else 0)
                loss.backward()
                key = f"B{B}L{L}M{M}S{S}{'i' if init else ''}seg{seg}_{str(dt)[6:]}_{'yvar' if var else 'y'}"
                out[key + "/y"] = y.detach()
                for n, t in x.items():
                    out[f"{key}/d{n}"] = t.grad
                if st is not None:
                    out[key + "/dlam0"], out[key + "/deta0"] = st.lam.grad, st.eta.grad
    return out


if __name__ == "__main__":
    if sys.argv[1] == "save":
        torch.save(run(), sys.argv[2])
    else:
        a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
        worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
        same = sum(torch.equal(a[k], b[k]) for k in a)
        print(f"{same}/{len(a)} tensors bit-identical; max |difference| {worst:.3g}")
