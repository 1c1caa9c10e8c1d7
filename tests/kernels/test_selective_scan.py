"""selective_scan_triton against the sequential float64 reference: outputs and every gradient by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from klalm.kernels.common import ScanConfig
from klalm.kernels.selective_scan import DEFAULT_CONFIG, selective_scan_triton
from klalm.ops.selective_scan import selective_scan_reference

NAMES = ("u", "delta", "A", "Bm", "Cm", "D", "initial_state")
TINY = ScanConfig(block_m=4, chunk=4, num_stages=2, unroll=2, bwd_block_m=8, bwd_num_stages=2, bwd_unroll=2)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖ in float64."""
    x, ref = x.detach().double(), ref.detach().double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_inputs(batch, length, channels, n_state, device, seed=0) -> dict[str, torch.Tensor]:
    """Mamba-like inputs: Δ = softplus(·) ~ 0.1..1, A = −exp(·) < 0."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    x = {
        "u": rand(batch, length, channels),
        "delta": F.softplus(rand(batch, length, channels) - 1.0),
        "A": -torch.exp(0.5 * rand(channels, n_state)),
        "Bm": rand(batch, length, n_state),
        "Cm": rand(batch, length, n_state),
        "D": rand(channels),
        "initial_state": rand(batch, channels, n_state),
    }
    return {name: t.to(device) for name, t in x.items()}


def run_both(x: dict, names: tuple[str, ...], config: ScanConfig, dtype=torch.float32, use_h=True):
    """Forward+backward of the kernel (inputs in `dtype`) and of the float64 reference on the same values;
    with use_h=False the loss ignores the final state (its cotangent is None, as in training)."""
    ours = {n: x[n].detach().to(dtype, copy=True).requires_grad_() for n in names}  # fresh leaves per call
    ref = {n: ours[n].detach().double().requires_grad_() for n in names}
    g = torch.Generator().manual_seed(1)
    w_y = torch.randn(x["u"].shape, generator=g).to(x["u"].device, torch.float64)
    w_h = torch.randn(x["initial_state"].shape, generator=g).to(x["u"].device, torch.float64)
    results = []
    for fn, inp, kwargs in ((selective_scan_triton, ours, {"config": config}), (selective_scan_reference, ref, {})):
        y, h = fn(*(inp.get(n) for n in NAMES), **kwargs)
        loss = (y.double() * w_y).sum()
        (loss + (h.double() * w_h).sum() if use_h else loss).backward()
        results.append(({"y": y, "h": h}, {n: t.grad for n, t in inp.items()}))
    return results


@pytest.mark.parametrize(
    "length,n_state,names",
    [
        pytest.param(1, 3, NAMES[:5], id="L1-N3"),
        pytest.param(7, 16, NAMES, id="L7-N16-D-init"),
        pytest.param(37, 5, NAMES[:6], id="L37-N5-D"),
    ],
)
def test_selective_scan_matches_reference(device, length, n_state, names):
    x = make_inputs(2, length, 6, n_state, device)
    (outs, grads), (ref_outs, ref_grads) = run_both(x, names, TINY)
    for name, ref in ref_outs.items():
        assert rel_err(outs[name], ref) <= 1e-5, f"output {name}: rel err {rel_err(outs[name], ref):.2e}"
    for name, ref in ref_grads.items():
        assert rel_err(grads[name], ref) <= 1e-4, f"d{name}: rel err {rel_err(grads[name], ref):.2e}"


def test_selective_scan_final_state_unused(device):
    x = make_inputs(2, 9, 6, 5, device, seed=4)
    (_, grads), (_, ref_grads) = run_both(x, NAMES, TINY, use_h=False)
    for name, ref in ref_grads.items():
        assert rel_err(grads[name], ref) <= 1e-4, f"d{name}: rel err {rel_err(grads[name], ref):.2e}"


def test_selective_scan_bf16_and_errors(device):
    x = make_inputs(1, 5, 4, 16, device, seed=2)
    (outs, grads), (ref_outs, ref_grads) = run_both(x, NAMES, TINY, dtype=torch.bfloat16)
    assert outs["y"].dtype == torch.bfloat16 and outs["h"].dtype == torch.float32
    assert all(rel_err(outs[n], r) <= 1e-2 for n, r in ref_outs.items())
    assert all(rel_err(grads[n], r) <= 2e-2 for n, r in ref_grads.items())
    with pytest.raises(ValueError, match="Cm"):
        selective_scan_triton(x["u"], x["delta"], x["A"], x["Bm"], x["Cm"][:, :2])
    with pytest.raises(ValueError, match="float64"):
        selective_scan_triton(*(x[n].double() for n in NAMES[:5]))


@pytest.mark.gpu
def test_selective_scan_gpu_real_size():
    """B=2, L=2048, M=1536, N=16 (Mamba d_inner at d_model 768) against the float64 reference."""
    x = make_inputs(2, 2048, 1536, 16, "cuda", seed=4)
    (outs, grads), (ref_outs, ref_grads) = run_both(x, NAMES, DEFAULT_CONFIG)
    errors = {f"out {n}": rel_err(outs[n], r) for n, r in ref_outs.items()}
    errors |= {f"d{n}": rel_err(grads[n], r) for n, r in ref_grads.items()}
    print({n: f"{e:.1e}" for n, e in errors.items()})
    assert all(e <= (1e-5 if n.startswith("out") else 1e-4) for n, e in errors.items()), errors
