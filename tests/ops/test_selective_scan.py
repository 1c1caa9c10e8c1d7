"""The selective scan's torch backend against the sequential reference (values and every gradient, float64)."""

from __future__ import annotations

import importlib

import pytest
import torch

from klalm.ops import backends
from klalm.ops.backends import resolve_backend
from klalm.ops.selective_scan import selective_scan, selective_scan_reference, selective_scan_torch

ss = importlib.import_module("klalm.ops.selective_scan")  # the package re-exports a function of the same name

NAMES = ("u", "delta", "A", "Bm", "Cm", "D", "initial_state")


def make_inputs(length, batch=2, channels=3, state=4, dtype=torch.float64, seed=0, with_d=True, with_h0=True):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    inputs = {
        "u": rand(batch, length, channels),
        "delta": torch.rand(batch, length, channels, generator=gen, dtype=dtype) * 0.8 + 0.01,
        "A": -(torch.rand(channels, state, generator=gen, dtype=dtype) * 4 + 0.1),
        "Bm": rand(batch, length, state),
        "Cm": rand(batch, length, state),
        "D": rand(channels) if with_d else None,
        "initial_state": rand(batch, channels, state) if with_h0 else None,
    }
    return {k: None if v is None else v.requires_grad_() for k, v in inputs.items()}


def outputs_and_grads(fn, inputs, seed=1):
    y, h = fn(*inputs.values())
    gen = torch.Generator().manual_seed(seed)
    wy, wh = (torch.randn(x.shape, generator=gen, dtype=x.dtype).to(x.device) for x in (y, h))
    leaves = {k: v for k, v in inputs.items() if v is not None}
    grads = torch.autograd.grad((y * wy).sum() + (h * wh).sum(), list(leaves.values()))
    return y, h, dict(zip(leaves, grads))


@pytest.mark.parametrize("length", [1, 2, 37, 300], ids=lambda n: f"L{n}")
@pytest.mark.parametrize("with_extras", [True, False], ids=["D_h0", "bare"])
def test_torch_matches_reference(length, with_extras):
    inputs = make_inputs(length, with_d=with_extras, with_h0=with_extras)
    y_ref, h_ref, g_ref = outputs_and_grads(selective_scan_reference, inputs)
    y, h, g = outputs_and_grads(selective_scan_torch, inputs)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-9, atol=1e-9, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("chunk_size", [1, 5, 16, 500])
def test_torch_any_chunk_size(chunk_size):
    inputs = make_inputs(37)
    y_ref, h_ref, g_ref = outputs_and_grads(selective_scan_reference, inputs)
    y, h, g = outputs_and_grads(lambda *a: selective_scan_torch(*a, chunk_size=chunk_size), inputs)
    torch.testing.assert_close((y, h), (y_ref, h_ref), rtol=1e-10, atol=1e-10)
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-9, atol=1e-9)


def test_torch_gradcheck():
    inputs = make_inputs(9, batch=1, channels=2, state=3)
    assert torch.autograd.gradcheck(lambda *a: selective_scan_torch(*a, chunk_size=4), tuple(inputs.values()))


def test_reference_gradcheck():
    inputs = make_inputs(5, batch=1, channels=2, state=2)
    assert torch.autograd.gradcheck(selective_scan_reference, tuple(inputs.values()))


def test_float32_and_bfloat16_inputs():
    exact = make_inputs(64, seed=3)
    y64 = selective_scan_reference(*exact.values())[0]
    y32, h32 = selective_scan(*(x.detach().float() for x in exact.values()), backend="torch")
    assert y32.dtype == torch.float32 and h32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y64.detach(), rtol=1e-5, atol=1e-5)
    y16, h16 = selective_scan(*(x.detach().bfloat16() for x in exact.values()), backend="torch")
    assert y16.dtype == torch.bfloat16 and h16.dtype == torch.float32


def test_long_sequence_stays_finite():
    inputs = make_inputs(200, seed=4)
    inputs["delta"] = (inputs["delta"].detach() * 20).requires_grad_()  # decays down to exp(-16·4·20)
    y, h, g = outputs_and_grads(selective_scan_torch, inputs)
    y_ref, h_ref, g_ref = outputs_and_grads(selective_scan_reference, inputs)
    assert all(torch.isfinite(t).all() for t in (y, h, *g.values()))
    torch.testing.assert_close((y, h), (y_ref, h_ref), rtol=1e-10, atol=1e-10)


def test_auto_backend_choice(monkeypatch):
    monkeypatch.setattr(backends, "_AUTO", {})  # decide afresh
    cuda = torch.device("cuda", 0)
    assert resolve_backend(ss.SELECTIVE_SCAN_OP, "auto", torch.device("cpu"), torch.float32) == "torch"
    monkeypatch.setattr(ss.SELECTIVE_SCAN_OP, "usable", lambda device: (False, "no kernel"))
    assert resolve_backend(ss.SELECTIVE_SCAN_OP, "auto", cuda, torch.float32) == "torch"
    monkeypatch.setattr(ss.SELECTIVE_SCAN_OP, "usable", lambda device: (True, "imports"))
    backends._AUTO.clear()
    assert resolve_backend(ss.SELECTIVE_SCAN_OP, "auto", cuda, torch.float32) == "triton"


def test_triton_usable_names_the_import_error(monkeypatch):
    def missing():
        raise ImportError("no module named klalm.kernels.selective_scan")

    monkeypatch.setattr(ss, "_load_triton", missing)
    assert ss._triton_usable(torch.device("cuda", 0)) == (False, "no module named klalm.kernels.selective_scan")


def test_bad_backend_and_shapes_raise(monkeypatch):
    inputs = [x.detach() for x in make_inputs(4).values()]
    with pytest.raises(ValueError, match="unknown selective_scan backend 'cuda'.*reference"):
        selective_scan(*inputs, backend="cuda")
    from klalm.kernels import common  # noqa: F401  (imported before the patch)

    monkeypatch.setattr(common, "interpreting", lambda: False)  # CPU tensors run the kernels only when interpreted
    with pytest.raises(ValueError, match="need CUDA tensors"):
        selective_scan(*inputs, backend="triton")
    bad = list(inputs)
    bad[3] = bad[3][:, :, :2]
    with pytest.raises(ValueError, match="Bm must have shape"):
        selective_scan(*bad)
    bad = list(inputs)
    bad[6] = bad[6][:1]
    with pytest.raises(ValueError, match="initial_state must have shape"):
        selective_scan(*bad)


@pytest.mark.gpu
def test_triton_matches_reference_on_cuda():
    inputs = {k: v.detach().float().cuda().requires_grad_() for k, v in make_inputs(300).items()}
    y_ref, h_ref, g_ref = outputs_and_grads(selective_scan_reference, inputs)
    y, h, g = outputs_and_grads(lambda *a: selective_scan(*a, backend="triton"), inputs)
    torch.testing.assert_close((y, h), (y_ref, h_ref), rtol=1e-4, atol=1e-4)
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-3, atol=1e-3)


def test_torch_path_ignores_autocast():
    inputs = [x.detach().float() for x in make_inputs(40, seed=5).values()]
    y, h = selective_scan(*inputs, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ac, h_ac = selective_scan(*inputs, backend="torch")
    assert y_ac.dtype == torch.float32
    torch.testing.assert_close((y_ac, h_ac), (y, h), rtol=0, atol=0)


def test_auto_fallback_warns_once_with_the_reason(monkeypatch, caplog):
    monkeypatch.setattr(backends, "_AUTO", {})  # decide afresh
    monkeypatch.setattr(ss.SELECTIVE_SCAN_OP, "usable", lambda device: (False, "no module named klalm.kernels.x"))
    with caplog.at_level("WARNING", logger="klalm.ops.backends"):
        for _ in range(3):
            resolve_backend(ss.SELECTIVE_SCAN_OP, "auto", torch.device("cuda", 0), torch.float32)
    assert [r.getMessage() for r in caplog.records] == [
        "selective_scan backend 'auto' on cuda:0 torch.float32: 'torch' (no module named klalm.kernels.x)"
    ]


def test_float32_long_sequence_as_accurate_as_the_float32_loop():
    inputs = {k: v.detach() for k, v in make_inputs(1024, batch=1, channels=8, state=16, seed=6).items()}
    inputs["A"] = -torch.arange(1.0, 17.0, dtype=torch.float64).repeat(8, 1)  # S4D-real, as Mamba initialises it
    y64, _ = selective_scan_reference(*inputs.values())
    y_torch, _ = selective_scan_torch(*(x.float() for x in inputs.values()))
    y_loop, _ = selective_scan_reference(*(x.float() for x in inputs.values()))
    scale = y64.abs().max()
    err_torch, err_loop = ((y - y64).abs().max() / scale for y in (y_torch.double(), y_loop.double()))
    assert err_torch < 1e-6 and err_torch < 4 * err_loop + 1e-7
