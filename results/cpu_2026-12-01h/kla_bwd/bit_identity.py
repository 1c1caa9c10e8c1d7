"""y, the final state and every gradient of `kla_scan_triton` under the Triton interpreter, saved for one tree or
compared bit for bit between two saved runs (extends ../../cpu_2026-12-01g/kla_bwd/bit_identity.py with fp16 rows,
the log σ² path (precision_floor) and decoding from the prior).

    TRITON_INTERPRET=1 .venv/bin/python results/cpu_2026-12-01h/kla_bwd/bit_identity.py save OUT.pt   # each tree
    .venv/bin/python results/cpu_2026-12-01h/kla_bwd/bit_identity.py compare head.pt patched.pt
"""

import sys

import torch

# (B, L, M, S, initial state, segment): whole rows; S < S_PAD with an initial state and the time-parallel split;
# M % BM != 0 and S < S_PAD; the split with whole rows
SHAPES = [(2, 70, 32, 16, False, 0), (1, 96, 16, 4, True, 32), (2, 40, 20, 3, False, 0), (1, 64, 48, 16, True, 32)]
FLOOR = 1e-4


def draw_inputs(g: torch.Generator, B: int, L: int, M: int, S: int, dt: torch.dtype, logvar: bool) -> dict:
    """One case's `kla_scan_triton` inputs drawn from g, each a leaf: v, k, q (and log σ² when logvar, given in place
    of Λ) in dt, the rest in fp32."""
    import torch.nn.functional as F

    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x = dict(
        v=r(B, L, M),
        lambda_v=r(B, L, M) if logvar else 1.0 / (F.softplus(r(B, L, M)) + FLOOR),
        k=F.normalize(r(B, L, S), dim=-1),
        q=F.normalize(r(B, L, S), dim=-1),
        a=torch.exp(-F.softplus(r(M, S)) * 0.5),
        p=F.softplus(r(M, S)) * 0.05,
    )
    for n in ("v", "k", "q") + (("lambda_v",) if logvar else ()):
        x[n] = x[n].to(dt)
    return {n: t.requires_grad_() for n, t in x.items()}


def draw_state(g: torch.Generator, B: int, M: int, S: int):
    """An initial state drawn from g (λ in [0.5, 1.5), η normal), each a leaf that takes a gradient."""
    from klalm.ops.common import KLAState

    lam = 0.5 + torch.rand(B, M, S, generator=g)
    return KLAState(lam.requires_grad_(), torch.randn(B, M, S, generator=g).requires_grad_())


def record(out: dict, key: str, y, final, inputs: dict, state) -> None:
    """Save one case under `key`: y, the final state, every input's gradient and the initial state's (if given)."""
    out[key + "/y"] = y.detach()
    out[key + "/lam"], out[key + "/eta"] = final.lam.detach(), final.eta.detach()
    for n, t in inputs.items():
        out[f"{key}/d{n}"] = t.grad
    if state is not None:
        out[key + "/dlam0"], out[key + "/deta0"] = state.lam.grad, state.eta.grad


def compare(path_a: str, path_b: str) -> None:
    """Print how many saved tensors of two runs are bit-identical, the largest difference, and which differ."""
    a, b = torch.load(path_a), torch.load(path_b)
    assert a.keys() == b.keys()
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    same = sum(torch.equal(a[k], b[k]) for k in a)
    print(f"{same}/{len(a)} tensors bit-identical; max |difference| {worst:.3g}")
    for k in a:
        if not torch.equal(a[k], b[k]):
            print("  differs:", k)


def run():
    from klalm.kernels.common import ScanConfig
    from klalm.kernels.mobius_scan import kla_scan_triton

    out = {}
    cases = []
    for bi in range(len(SHAPES)):
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            for var in (False, True):
                cases.append((bi, dt, var, False, False))
        cases.append((bi, torch.float32, False, True, False))  # log σ² in, fp32
        cases.append((bi, torch.bfloat16, bi % 2 == 1, True, False))  # log σ² in, bf16 (all rows)
        cases.append((bi, torch.bfloat16, bi % 2 == 0, False, True))  # decode from the prior
    for bi, dt, var, logvar, prior in cases:
        B, L, M, S, init, seg = SHAPES[bi]
        g = torch.Generator().manual_seed(bi)
        r = lambda *s, g=g: torch.randn(*s, generator=g)  # noqa: E731
        x = draw_inputs(g, B, L, M, S, dt, logvar)
        st = draw_state(g, B, M, S) if init else None
        cfg = ScanConfig(chunk=16, segment=seg)
        y, yv, fin = kla_scan_triton(
            *x.values(), initial_state=st, decode_from_prior=prior, config=cfg, variance=var,
            precision_floor=FLOOR if logvar else None,
        )  # fmt: skip
        gy = r(*y.shape)
        loss = (y.float() * gy).sum() + ((yv * r(*yv.shape)).sum() if var else 0)
        loss = loss + (fin.lam * r(*fin.lam.shape)).sum() * (bi % 2) + (fin.eta * r(*fin.eta.shape)).sum() * (bi % 2)
        loss.backward()
        key = (f"B{B}L{L}M{M}S{S}{'i' if init else ''}seg{seg}_{str(dt)[6:]}_{'yvar' if var else 'y'}"
               f"{'_logvar' if logvar else ''}{'_prior' if prior else ''}")  # fmt: skip
        record(out, key, y, fin, x, st)
        print(key, flush=True)
    return out


if __name__ == "__main__":
    torch.save(run(), sys.argv[2]) if sys.argv[1] == "save" else compare(sys.argv[2], sys.argv[3])
