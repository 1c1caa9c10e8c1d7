"""selective_scan_triton against the sequential float64 reference: outputs and every gradient by name, for the
sequential walk and the time-parallel split (`ScanConfig.segment`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from klalm.kernels import selective_scan
from klalm.kernels.common import ScanConfig
from klalm.kernels.selective_scan import DEFAULT_CONFIG, SPLIT_CONFIG, selective_scan_triton
from klalm.ops.selective_scan import selective_scan_reference

NAMES = ("u", "delta", "A", "Bm", "Cm", "D", "initial_state")
TINY = ScanConfig(block_m=4, chunk=4, num_stages=2, unroll=2, bwd_block_m=8, bwd_num_stages=2, bwd_unroll=2)
SEGMENTS = TINY._replace(segment=8)  # time-parallel: segments of two chunks
CONFIGS = [pytest.param(TINY, id="sequential"), pytest.param(SEGMENTS, id="segments")]


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


def assert_matches(outs, grads, ref_outs, ref_grads, out_tol=1e-5, grad_tol=1e-4):
    for name, ref in ref_outs.items():
        assert rel_err(outs[name], ref) <= out_tol, f"output {name}: rel err {rel_err(outs[name], ref):.2e}"
    for name, ref in ref_grads.items():
        assert rel_err(grads[name], ref) <= grad_tol, f"d{name}: rel err {rel_err(grads[name], ref):.2e}"


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize(
    "length,n_state,names",
    [
        pytest.param(1, 3, NAMES[:5], id="L1-N3"),
        pytest.param(7, 16, NAMES, id="L7-N16-D-init"),
        pytest.param(37, 5, NAMES[:6], id="L37-N5-D"),
        pytest.param(16, 4, NAMES, id="L16-N4-D-init"),  # segments end exactly at L
    ],
)
def test_selective_scan_matches_reference(device, length, n_state, names, config):
    x = make_inputs(2, length, 6, n_state, device)
    ours, ref = run_both(x, names, config)
    assert_matches(*ours, *ref)


@pytest.mark.parametrize("config", CONFIGS)
def test_selective_scan_final_state_unused(device, config):
    x = make_inputs(2, 19, 6, 5, device, seed=4)
    (_, grads), (_, ref_grads) = run_both(x, NAMES, config, use_h=False)
    for name, ref in ref_grads.items():
        assert rel_err(grads[name], ref) <= 1e-4, f"d{name}: rel err {rel_err(grads[name], ref):.2e}"


def test_default_config_by_shape():
    """The split's config (bwd_block_m 16) where the automatic split cuts time into segments, else DEFAULT_CONFIG:
    at 16,384 tokens, M1536 N16 the split starts at B4 L4096 (B·M·N below SEQUENTIAL_MIN_CHAINS, L ≥ 512)."""
    pick = selective_scan.default_config
    assert DEFAULT_CONFIG._replace(bwd_block_m=16) == SPLIT_CONFIG
    assert pick(8, 2048, 1536, 16) == pick(16, 2048, 1024, 16) == pick(1, 511, 8, 4) == DEFAULT_CONFIG
    assert pick(4, 4096, 1536, 16) == pick(1, 65536, 1536, 16) == pick(1, 512, 8, 4) == SPLIT_CONFIG


def test_default_config_matches_reference(device, monkeypatch):
    """No config given at a shape the automatic split cuts (L 600, two segments): the split's config, against the
    float64 reference."""
    picked = []
    real = selective_scan.default_config
    monkeypatch.setattr(selective_scan, "default_config", lambda *shape: picked.append(real(*shape)) or picked[-1])
    ours, ref = run_both(make_inputs(1, 600, 4, 3, device, seed=12), NAMES, None)
    assert picked == [SPLIT_CONFIG]
    assert_matches(*ours, *ref)


def test_selective_scan_long_sequence_time_parallel(device):
    """L = 261 (not a multiple of the chunk or the segment): segments of 64 steps against the reference."""
    x = make_inputs(1, 261, 4, 3, device, seed=11)
    ours, ref = run_both(x, NAMES, TINY._replace(chunk=16, segment=64, unroll=4, bwd_unroll=4))
    assert_matches(*ours, *ref)


@pytest.mark.parametrize("config", CONFIGS)
def test_selective_scan_state_carried_across_calls(device, config):
    """Two calls, the second from the first's final state, equal one call, gradients through the carried state."""
    x = make_inputs(2, 29, 6, 5, device, seed=12)
    names = NAMES[:6]
    results = []
    for fn, dtype, kwargs in ((selective_scan_triton, torch.float32, {"config": config}),
                              (selective_scan_reference, torch.float64, {})):  # fmt: skip
        inp = {n: x[n].detach().to(dtype, copy=True).requires_grad_() for n in names}
        split = [(t[:, :13], t[:, 13:]) if t.dim() == 3 else (t, t) for t in (inp[n] for n in names)]
        y1, h = fn(*(first for first, _ in split), **kwargs)
        y2, h = fn(*(second for _, second in split), initial_state=h, **kwargs)
        y = torch.cat([y1, y2], 1)
        g = torch.Generator().manual_seed(3)
        ((y.double() * torch.randn(y.shape, generator=g, dtype=torch.float64)).sum() + h.double().sum()).backward()
        results.append(({"y": y, "h": h}, {n: inp[n].grad for n in names}))
    assert_matches(*results[0], *results[1])


ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}  # one unit in the last place, relative


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("channels,n_state", [(6, 4), (5, 3)], ids=["even-widths", "odd-widths"])
def test_16bit_inputs_give_the_float32_result(device, dtype, channels, n_state, config):
    """u, Δ, B, C in 16 bits (A, D, h0 float32, as Mamba under autocast) give the result of the same values in
    float32: y, du, dΔ, dB, dC in the 16-bit dtype within one unit in its last place, the rest to 1e-6."""
    x = make_inputs(2, 11, channels, n_state, device, seed=2)
    narrow = ("u", "delta", "Bm", "Cm")
    low = {n: x[n].to(dtype) if n in narrow else x[n] for n in NAMES}
    results = []
    for inp in (low, {n: t.float() for n, t in low.items()}):
        leaves = {n: t.detach().clone().requires_grad_() for n, t in inp.items()}
        y, h = selective_scan_triton(*(leaves[n] for n in NAMES), config=config)
        g = torch.Generator().manual_seed(4)
        w_y, w_h = (torch.randn(t.shape, generator=g).to(dtype).to(t) for t in (y, h))
        torch.autograd.backward([y, h], [w_y, w_h])
        results.append(({"y": y, "h": h}, {n: t.grad for n, t in leaves.items()}))
    (outs, grads), (outs32, grads32) = results
    assert outs["y"].dtype == dtype
    torch.testing.assert_close(outs["y"].float(), outs32["y"], rtol=ULP[dtype], atol=1e-6)
    torch.testing.assert_close(outs["h"], outs32["h"], rtol=1e-6, atol=1e-7)
    for name in NAMES:
        assert grads[name].dtype == low[name].dtype, name
        tol = (ULP[dtype], 1e-6) if name in narrow else (1e-6, 1e-7)
        torch.testing.assert_close(
            grads[name].float(), grads32[name], rtol=tol[0], atol=tol[1], msg=lambda m, name=name: f"{name}: {m}"
        )


@pytest.mark.parametrize("config,names", [(TINY, NAMES[:5]), (SEGMENTS, NAMES)], ids=["sequential", "segments-D-init"])
def test_custom_ops_pass_opcheck(device, config, names):
    """klalm::selective_scan_fwd / _bwd: schema, fake implementations, autograd registration, AOT dispatch."""
    x = make_inputs(2, 9, 6, 4, device, seed=17)
    inp = [x[n].clone().requires_grad_() if n in names else None for n in NAMES]
    fwd_args = (*inp, list(config), True)
    torch.library.opcheck(torch.ops.klalm.selective_scan_fwd.default, fwd_args)
    y, h, ckpt = torch.ops.klalm.selective_scan_fwd(*fwd_args)
    plain = [None if t is None else t.detach() for t in inp]
    bwd_args = (*plain, ckpt, torch.randn_like(y), torch.randn_like(h), list(config))
    torch.library.opcheck(torch.ops.klalm.selective_scan_bwd.default, bwd_args)


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
    with pytest.raises(ValueError, match="state_slice=2"):
        selective_scan_triton(*(x[n] for n in NAMES[:5]), config=TINY._replace(state_slice=2))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, DEFAULT_CONFIG, DEFAULT_CONFIG._replace(segment=1 << 30)],
                         ids=["default", "split-bwd_block_m-8", "sequential"])  # fmt: skip
def test_selective_scan_gpu_real_size(config):
    """B=2, L=2048, M=1536, N=16 (Mamba d_inner at d_model 768) against the float64 reference: the automatic split
    (4 time-parallel segments) on the default for the shape (SPLIT_CONFIG) and on DEFAULT_CONFIG, and one segment."""
    x = make_inputs(2, 2048, 1536, 16, "cuda", seed=4)
    (outs, grads), (ref_outs, ref_grads) = run_both(x, NAMES, config)
    errors = {f"out {n}": rel_err(outs[n], r) for n, r in ref_outs.items()}
    errors |= {f"d{n}": rel_err(grads[n], r) for n, r in ref_grads.items()}
    print({n: f"{e:.1e}" for n, e in errors.items()})
    assert all(e <= (1e-5 if n.startswith("out") else 1e-4) for n, e in errors.items()), errors
