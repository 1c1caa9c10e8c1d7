"""kla_scan / kla_step: the "torch" backend against the sequential reference, output by output and
gradient by gradient, plus edge cases, dtypes, state carry, dispatch and input errors."""

from __future__ import annotations

import logging

import pytest
import torch

from klalm.ops import BACKENDS, KLAState, kla_scan, kla_scan_logvar, kla_step
from klalm.ops.checks import value_checks_enabled, value_checks_suspended
from klalm.ops.chunked_scan import kla_scan_torch
from klalm.ops.common import precision_from_logvar
from klalm.ops.reference import kla_scan_reference

NAMES = ("v", "lambda_v", "k", "q", "a", "p", "lam0", "eta0")


def make_inputs(batch=2, length=9, channels=3, state=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(batch, length, channels, generator=g, dtype=dtype)
    lambda_v = torch.rand(batch, length, channels, generator=g, dtype=dtype) * 3 + 0.1
    k = torch.randn(batch, length, state, generator=g, dtype=dtype)
    q = torch.randn(batch, length, state, generator=g, dtype=dtype)
    a = torch.rand(channels, state, generator=g, dtype=dtype) * 0.5 + 0.5
    p = torch.rand(channels, state, generator=g, dtype=dtype) * 0.3
    lam0 = torch.rand(batch, channels, state, generator=g, dtype=dtype) + 0.5
    eta0 = torch.randn(batch, channels, state, generator=g, dtype=dtype)
    return dict(zip(NAMES, (v, lambda_v, k, q, a, p, lam0, eta0)))


def run_with_grads(fn, inputs, prior=False, seed=1, used=("y", "y_var", "lam", "eta")):
    """Outputs (y, y_var, lam, eta) and the gradients of a random linear loss of the outputs in `used` w.r.t.
    every input, by name (zeros where an input does not reach the loss)."""
    leaves = {n: x.detach().clone().requires_grad_() for n, x in inputs.items()}
    args = [leaves[n] for n in NAMES[:6]]
    y, y_var, state = fn(*args, KLAState(leaves["lam0"], leaves["eta0"]), prior)
    outs = {"y": y, "y_var": y_var, "lam": state.lam, "eta": state.eta}
    g = torch.Generator().manual_seed(seed)
    weights = {n: torch.randn(o.shape, generator=g, dtype=torch.float64).to(o) for n, o in outs.items()}
    loss = sum((weights[n] * outs[n]).sum() for n in used)
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    grads = [torch.zeros_like(x) if gr is None else gr for x, gr in zip(leaves.values(), grads)]
    return {n: o.detach() for n, o in outs.items()}, dict(zip(NAMES, grads))


def assert_all_close(ref, got, rtol, atol=0.0):
    for name in ref:
        assert torch.isfinite(got[name]).all(), f"{name}: non-finite values"
        scale = ref[name].abs().max().clamp_min(1e-30)
        err = ((got[name].double() - ref[name].double()).abs().max() / scale).item()
        assert err <= rtol or (got[name] - ref[name]).abs().max() <= atol, f"{name}: relative error {err:.2e}"


def compare_backends(inputs, prior=False, chunk_size=None, rtol=1e-10):
    torch_fn = lambda *a: kla_scan_torch(*a, chunk_size=chunk_size)  # noqa: E731
    ref_out, ref_grad = run_with_grads(kla_scan_reference, inputs, prior)
    out, grad = run_with_grads(torch_fn, inputs, prior)
    assert_all_close(ref_out, out, rtol)
    assert_all_close(ref_grad, grad, rtol)


@pytest.mark.parametrize("prior", [False, True], ids=["posterior", "prior"])
@pytest.mark.parametrize("length", [1, 2, 37, 300], ids=lambda n: f"L{n}")
def test_torch_matches_reference(length, prior):
    compare_backends(make_inputs(length=length, seed=length), prior=prior)


@pytest.mark.parametrize("used", [("y",), ("y", "eta"), ("y_var", "lam")], ids="+".join)
@pytest.mark.parametrize("prior", [False, True], ids=["posterior", "prior"])
def test_torch_unused_outputs(used, prior):
    """Outputs the loss ignores reach the backward as None (y_var in training); the gradients stay exact."""
    torch_fn = lambda *a: kla_scan_torch(*a, chunk_size=4)  # noqa: E731  (3 chunks: carries and final seeds)
    inputs = make_inputs(length=11)
    _, ref_grad = run_with_grads(kla_scan_reference, inputs, prior, used=used)
    _, grad = run_with_grads(torch_fn, inputs, prior, used=used)
    assert_all_close(ref_grad, grad, 1e-10, atol=1e-300)


@pytest.mark.parametrize("chunk", [1, 4, 7, 37, 64], ids=lambda c: f"C{c}")
def test_torch_any_chunk_size(chunk):
    compare_backends(make_inputs(length=37, seed=3), chunk_size=chunk)


def test_torch_gradcheck_float64():
    inputs = [x.requires_grad_() for x in make_inputs(batch=1, length=5, channels=2, state=3).values()]

    def fn(v, lambda_v, k, q, a, p, lam0, eta0):
        y, y_var, state = kla_scan_torch(v, lambda_v, k, q, a, p, KLAState(lam0, eta0), True, chunk_size=2)
        return y, y_var, state.lam, state.eta

    assert torch.autograd.gradcheck(fn, inputs)


def _edge(name):
    x = make_inputs(length=40, seed=7)
    if name == "k_zero":  # φ = 0: "no information" tokens, incl. the first and the last
        x["k"][:, ::3] = 0.0
        x["k"][:, -1] = 0.0
    elif name == "confident":  # Λ ≈ 1e4
        x["lambda_v"] = 1e4 * (1 + 0.01 * x["lambda_v"])
    elif name == "p0_a_near_1":  # linear (GLA-like) precision recursion, almost no decay
        x["p"] = torch.zeros_like(x["p"])
        x["a"] = 1 - 1e-4 * x["a"]
    elif name == "a_one":
        x["a"] = torch.ones_like(x["a"])
    elif name == "fast_decay":  # a ≈ 0.01-0.1 with noise: 1/a² ≈ 1e2-1e4 per step inside the Möbius products
        x["a"] = 0.01 + 0.09 * x["a"]
        x["p"] = 0.1 + x["p"]
    return x


EDGE_CASES = ["k_zero", "confident", "p0_a_near_1", "a_one", "fast_decay"]


@pytest.mark.parametrize("case", EDGE_CASES)
def test_edge_cases_float64(case):
    compare_backends(_edge(case), rtol=1e-9)


@pytest.mark.parametrize("chunk", [None, 40], ids=["C7", "C40"])
@pytest.mark.parametrize("case", EDGE_CASES)
def test_edge_cases_float32_against_float64(case, chunk):
    x = _edge(case)
    ref_out, ref_grad = run_with_grads(kla_scan_reference, x)
    torch_fn = lambda *a: kla_scan_torch(*a, chunk_size=chunk)  # noqa: E731
    out, grad = run_with_grads(torch_fn, {n: t.float() for n, t in x.items()})
    assert_all_close(ref_out, out, rtol=2e-4)
    assert_all_close(ref_grad, grad, rtol=2e-3)


def test_zero_process_noise_long_sequence_float32():
    """p = 0 (the mixer's `zero_process_noise` option) with a in [0.85, 0.95]: λ grows like a^(−2t) and passes
    float32's range within 600 steps (a = 0.9: t ≈ 421). The torch backend carries (P, μ), as the Triton kernels
    do (tests/kernels: test_zero_process_noise_with_fast_decay), and stays exact there."""
    x = make_inputs(batch=1, length=600, channels=3, state=2, seed=5)
    x["p"] = torch.zeros_like(x["p"])
    x["a"] = 0.85 + 0.1 * torch.rand(x["a"].shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    used = ("y", "y_var")
    ref_out, ref_grad = run_with_grads(kla_scan_reference, x, used=used)
    out, grad = run_with_grads(kla_scan_torch, {n: t.float() for n, t in x.items()}, used=used)
    del ref_grad["p"], grad["p"]  # the reference's dp cancels here (see test_zero_process_noise_dp)
    assert_all_close({n: ref_out[n] for n in used}, {n: out[n] for n in used}, rtol=2e-4)
    assert_all_close(ref_grad, grad, rtol=2e-3)


def _zero_noise_inputs(a_grid=False):
    """The inputs above (p = 0, L = 600): a drawn in [0.85, 0.95], or with a_grid every a from 0.85 to 0.95."""
    x = make_inputs(batch=1, length=600, channels=3, state=2, seed=5)
    x["p"] = torch.zeros_like(x["p"])
    if a_grid:
        x["a"] = torch.linspace(0.85, 0.95, 6, dtype=torch.float64).view(3, 2)
    else:
        x["a"] = 0.85 + 0.1 * torch.rand(x["a"].shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    return x


def _two_calls(split):
    """kla_scan_torch as two calls, the second starting from the first's final state (λ, η), gradients through it."""

    def scan(v, lambda_v, k, q, a, p, state, prior):
        y1, v1, mid = kla_scan_torch(v[:, :split], lambda_v[:, :split], k[:, :split], q[:, :split], a, p, state, prior)
        y2, v2, end = kla_scan_torch(v[:, split:], lambda_v[:, split:], k[:, split:], q[:, split:], a, p, mid, prior)
        return torch.cat([y1, y2], 1), torch.cat([v1, v2], 1), end

    return scan


def test_zero_process_noise_state_carry_float64():
    """p = 0 with every a from 0.85 to 0.95: two halves of L = 600 with the state handed over equal one scan, the
    outputs, the final state (λ up to ~2e85, far past float32's range) and every gradient through the hand-over but
    dp, which loses accuracy there (λ_300 up to ~1e43; chunked_scan's docstring)."""
    x = _zero_noise_inputs(a_grid=True)
    used = ("y", "y_var")
    one_out, one_grad = run_with_grads(kla_scan_torch, x, used=used)
    two_out, two_grad = run_with_grads(_two_calls(300), x, used=used)
    del one_grad["p"], two_grad["p"]
    assert one_out["lam"].max() > 1e80
    assert_all_close(one_out, two_out, rtol=1e-12)
    assert_all_close(one_grad, two_grad, rtol=1e-10)


def test_zero_process_noise_state_carry_float32():
    """The halves in float32 against the float64 reference, with a drawn as in the first p = 0 test (0.889 to 0.939):
    λ_300 (≈ 1e31) is still finite, so the state can cross the call boundary, and the second call runs on past
    float32's range. With a = 0.85, λ_300 ≈ 1e43 would itself be beyond float32, which the (λ, η) state cannot hold."""
    x = _zero_noise_inputs()
    used = ("y", "y_var")
    ref_out, ref_grad = run_with_grads(kla_scan_reference, x, used=used)
    out, grad = run_with_grads(_two_calls(300), {n: t.float() for n, t in x.items()}, used=used)
    del ref_grad["p"], grad["p"]  # the reference's dp cancels, and ours through the hand-over too
    assert torch.isinf(out["lam"]).any()  # the honest final λ
    assert_all_close({n: ref_out[n] for n in used}, {n: out[n] for n in used}, rtol=2e-4)
    assert_all_close(ref_grad, grad, rtol=2e-3)


@pytest.mark.parametrize("chunk", [None, 600], ids=["C25", "C600"])
def test_zero_process_noise_decode_from_prior_float32(chunk):
    """decode_from_prior at p = 0 (readout a·μ, a²·σ²), float32 against the float64 reference, chunked and not."""
    x = _zero_noise_inputs()
    used = ("y", "y_var")
    torch_fn = lambda *a: kla_scan_torch(*a, chunk_size=chunk)  # noqa: E731
    ref_out, ref_grad = run_with_grads(kla_scan_reference, x, prior=True, used=used)
    out, grad = run_with_grads(torch_fn, {n: t.float() for n, t in x.items()}, prior=True, used=used)
    del ref_grad["p"], grad["p"]  # the reference's dp cancels (see test_zero_process_noise_dp)
    assert torch.isinf(out["lam"]).any()
    assert_all_close({n: ref_out[n] for n in used}, {n: out[n] for n in used}, rtol=2e-4)
    assert_all_close(ref_grad, grad, rtol=2e-3)


def _covariance_loop(v, lambda_v, k, q, a, p, state, prior):
    """The filter as a plain loop in covariance form, P = 1/λ and μ = η/λ (docs/kla.md), for autograd."""
    cov, mean = 1 / state.lam, state.eta / state.lam
    ys, y_vars = [], []
    for t in range(v.shape[1]):
        k_, q_ = k[:, t, None, :], q[:, t, None, :]
        cov_pred = a * a * cov + p
        gain = 1 / (1 + lambda_v[:, t, :, None] * k_ * k_ * cov_pred)
        cov, mean = gain * cov_pred, gain * (a * mean + (v[:, t] * lambda_v[:, t])[:, :, None] * k_ * cov_pred)
        out_mean, out_var = (a * mean, a * a * cov + p) if prior else (mean, cov)
        ys.append((q_ * out_mean).sum(-1))
        y_vars.append((q_ * q_ * out_var).sum(-1))
    return torch.stack(ys, 1), torch.stack(y_vars, 1), KLAState(1 / cov, mean / cov)


@pytest.mark.parametrize("prior", [False, True], ids=["posterior", "prior"])
def test_zero_process_noise_dp(prior):
    """dp at p = 0, L = 600 against autograd through the covariance-form loop. The information-form reference's
    autograd sums terms of size ~λ into dp, which cancel: here it gives 1e15 to 1e17 against the true ~1e3."""
    x = _zero_noise_inputs()
    used = ("y", "y_var")
    _, want = run_with_grads(_covariance_loop, x, prior, used=used)
    for dtype, rtol in ((torch.float64, 1e-10), (torch.float32, 2e-3)):
        _, got = run_with_grads(kla_scan_torch, {n: t.to(dtype) for n, t in x.items()}, prior, used=used)
        assert_all_close({"p": want["p"]}, {"p": got["p"]}, rtol)


def test_k_zero_keeps_gradients():
    x = make_inputs(length=6)
    x["k"][:, 2] = 0.0
    _, grad = run_with_grads(kla_scan_torch, x)
    assert grad["k"][:, 2].abs().sum() > 0  # k = 0 must not kill ∂k


def test_state_carry_two_halves_equal_one_scan():
    x = make_inputs(length=37, seed=11)
    args = [x[n] for n in NAMES[:6]]
    state0 = KLAState(x["lam0"], x["eta0"])
    y, y_var, state = kla_scan(*args, state0, backend="torch")
    first = [t[:, :20] if t.dim() == 3 else t for t in args]
    second = [t[:, 20:] if t.dim() == 3 else t for t in args]
    y1, v1, s1 = kla_scan(*first, state0, backend="torch")
    y2, v2, s2 = kla_scan(*second, s1, backend="torch")
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.cat([v1, v2], 1), y_var, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s2.lam, state.lam)
    torch.testing.assert_close(s2.eta, state.eta)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_compute_in_float32(dtype):
    x = {n: t.to(dtype) for n, t in make_inputs(length=37).items()}
    args = [x[n] for n in NAMES[:6]]
    y, y_var, state = kla_scan(*args, KLAState(x["lam0"], x["eta0"]), backend="torch")
    assert y.dtype == dtype and y_var.dtype == dtype and state.lam.dtype == torch.float32
    y32, v32, s32 = kla_scan_reference(*[t.float() for t in args], KLAState(x["lam0"].float(), x["eta0"].float()))
    torch.testing.assert_close(y.float(), y32.to(dtype).float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(state.lam, s32.lam, rtol=1e-5, atol=1e-5)
    leaves = [t.detach().requires_grad_() for t in args]
    out = kla_scan(*leaves, backend="torch")
    (out[0].float().sum() + out[1].float().sum()).backward()
    assert all(t.grad.dtype == dtype and torch.isfinite(t.grad.float()).all() for t in leaves)


@pytest.mark.parametrize("prior", [False, True], ids=["posterior", "prior"])
def test_kla_step_equals_one_scan_step(prior):
    x = make_inputs(length=5)
    args = [x[n] for n in NAMES[:6]]
    y, y_var, state = kla_scan(*args[:4], *args[4:], KLAState(x["lam0"], x["eta0"]), decode_from_prior=prior)
    s = KLAState(x["lam0"], x["eta0"])
    for t in range(5):
        yt, vt, s = kla_step(*(a[:, t] for a in args[:4]), *args[4:], s, decode_from_prior=prior)
        torch.testing.assert_close(yt, y[:, t])
        torch.testing.assert_close(vt, y_var[:, t])
    torch.testing.assert_close(s.lam, state.lam)
    torch.testing.assert_close(s.eta, state.eta)


def test_torch_backend_saves_no_per_step_tensors():
    x = {n: t.float().requires_grad_() for n, t in make_inputs(batch=2, length=64, channels=8, state=4).items()}
    y, _, _ = kla_scan_torch(*[x[n] for n in NAMES[:6]], KLAState(x["lam0"], x["eta0"]))
    saved = sum(t.numel() for t in y.grad_fn.saved_tensors)
    inputs = sum(t.numel() for t in x.values())
    full = 2 * 64 * 8 * 4  # one [B, L, M, S] tensor
    assert saved <= inputs + full // 2, f"saved {saved} elements for {inputs} input elements"


def test_auto_picks_torch_on_cpu_and_logs(monkeypatch, caplog):
    from klalm.ops import backends, scan

    monkeypatch.setattr(backends, "_AUTO", {})  # decide afresh
    with caplog.at_level(logging.INFO, logger="klalm.ops.backends"):
        assert backends.resolve_backend(scan.KLA_SCAN_OP, "auto", torch.device("cpu"), torch.float32) == "torch"
        assert backends.resolve_backend(scan.KLA_SCAN_OP, "auto", torch.device("cpu"), torch.float32) == "torch"
    assert sum("kla_scan backend 'auto'" in r.getMessage() for r in caplog.records) == 1
    assert set(BACKENDS) >= {"reference", "torch", "triton"}


def test_auto_sends_float64_to_torch_even_on_cuda(monkeypatch):
    from klalm.ops import backends, scan

    monkeypatch.setattr(backends, "_AUTO", {})
    cuda = torch.device("cuda", 0)
    assert backends.resolve_backend(scan.KLA_SCAN_OP, "auto", cuda, torch.float64) == "torch"
    assert backends.resolve_backend(scan.KLA_SCAN_OP, "auto", cuda, torch.bfloat16) == "triton"


@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
def test_variance_false_returns_none_and_the_same_rest(backend):
    """variance=False: y_var is None, y and the final state are those of the full scan (triton interpreted on CPU),
    for kla_scan and kla_scan_logvar."""
    x = {n: t.float() for n, t in make_inputs(length=7).items()}
    args = [x[n] for n in NAMES[:6]]
    for scan in (kla_scan, lambda *a, **kw: kla_scan_logvar(*a, precision_floor=1e-4, **kw)):
        full = scan(*args, KLAState(x["lam0"], x["eta0"]), backend=backend)
        y, y_var, state = scan(*args, KLAState(x["lam0"], x["eta0"]), backend=backend, variance=False)
        assert y_var is None and full[1] is not None
        assert torch.equal(y, full[0]) and torch.equal(state.lam, full[2].lam) and torch.equal(state.eta, full[2].eta)
    empty = [t[:, :0] if t.dim() == 3 else t for t in args]
    assert kla_scan(*empty, backend=backend, variance=False)[1] is None


def test_fresh_state_default_and_empty_sequence():
    x = make_inputs(length=4)
    args = [x[n] for n in NAMES[:6]]
    y, _, state = kla_scan(*args, backend="torch")
    y_ref, _, _ = kla_scan(*args, backend="reference")
    torch.testing.assert_close(y, y_ref)
    empty = [t[:, :0] if t.dim() == 3 else t for t in args]
    y0, _, s0 = kla_scan(*empty, backend="torch")
    assert y0.shape == (2, 0, 3) and torch.equal(s0.lam, torch.ones_like(state.lam))


BAD = {
    "batch": ("k", lambda x: x[:1], "k must have shape"),
    "length": ("q", lambda x: x[:, :-1], "q must have shape"),
    "channels": ("lambda_v", lambda x: x[..., :-1], "lambda_v must have shape"),
    "state_size": ("q", lambda x: x[..., :-1], "q must have shape"),
    "a_shape": ("a", lambda x: x[None], "a must have shape"),
    "p_shape": ("p", lambda x: x.T, "p must have shape"),
    "state_shape": ("lam0", lambda x: x[:, :, :-1], "initial_state.lam must have shape"),
    "int_dtype": ("v", lambda x: x.long(), "v must be a floating-point tensor"),
    "lambda_zero": ("lambda_v", lambda x: x * 0, "lambda_v breaks the rule: value precision"),
    "lambda_neg": ("lambda_v", lambda x: -x, "lambda_v breaks the rule"),
    "a_zero": ("a", lambda x: x * 0, "a breaks the rule: discrete decay a in (0, 1]"),
    "a_above_one": ("a", lambda x: x + 1, "a breaks the rule"),
    "p_negative": ("p", lambda x: x - 1, "p breaks the rule: discrete process noise"),
    "nan_v": ("v", lambda x: x.index_fill(1, torch.tensor([2]), float("nan")), "v breaks the rule: all values finite"),
    "inf_k": ("k", lambda x: x.index_fill(1, torch.tensor([0]), float("inf")), "k breaks the rule"),
    "lam0_zero": ("lam0", lambda x: x * 0, "initial_state.lam breaks the rule"),
}


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inputs_raise_value_error_naming_the_tensor(case, backend):
    name, corrupt, message = BAD[case]
    x = make_inputs(length=5)
    x[name] = corrupt(x[name])
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        kla_scan(*[x[n] for n in NAMES[:6]], KLAState(x["lam0"], x["eta0"]), backend=backend)


def test_kla_step_checks_shapes():
    x = make_inputs(length=1)
    with pytest.raises(ValueError, match="k must have shape"):
        kla_step(
            x["v"][:, 0],
            x["lambda_v"][:, 0],
            x["k"][:1, 0],
            x["q"][:, 0],
            x["a"],
            x["p"],
            KLAState(x["lam0"], x["eta0"]),
        )


def test_unknown_and_unavailable_backends(monkeypatch):
    x = make_inputs(length=3)
    args = [x[n] for n in NAMES[:6]]
    with pytest.raises(ValueError, match="valid: .*'torch'"):
        kla_scan(*args, backend="cuda-magic")
    from klalm.kernels import common, mobius_scan  # noqa: F401  (imported before the patch, which it must not see)

    monkeypatch.setattr(common, "interpreting", lambda: False)  # CPU tensors run the kernels only when interpreted
    with pytest.raises(ValueError, match="need CUDA tensors"):
        kla_scan(*args, backend="triton")


def test_value_checks_switch(monkeypatch):
    monkeypatch.delenv("KLALM_CHECK_INPUTS", raising=False)
    assert value_checks_enabled(torch.device("cpu"))
    assert not value_checks_enabled(torch.device("cuda"))
    monkeypatch.setenv("KLALM_CHECK_INPUTS", "1")
    assert value_checks_enabled(torch.device("cuda"))


def test_training_suspends_the_default_value_checks(monkeypatch):
    """Inside training a NaN input flows through (the step is skipped there); the debug switch still checks."""
    monkeypatch.delenv("KLALM_CHECK_INPUTS", raising=False)
    x = make_inputs(dtype=torch.float32)
    x["v"][0, 3, 1] = float("nan")
    args = [x[n] for n in NAMES[:6]]
    for backend in ("torch", "reference"):
        with pytest.raises(ValueError, match="v breaks the rule: all values finite"):
            kla_scan(*args, backend=backend)
        with value_checks_suspended():
            y, _, _ = kla_scan(*args, backend=backend)
        assert not torch.isfinite(y).all()
    monkeypatch.setenv("KLALM_CHECK_INPUTS", "1")
    with value_checks_suspended(), pytest.raises(ValueError, match="v breaks the rule"):
        kla_scan(*args, backend="torch")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gpu_backends_match_reference(backend):
    x = {n: t.float().cuda() for n, t in make_inputs(length=300, channels=8, state=16).items()}
    fn = lambda *a: kla_scan(*a[:6], a[6], backend=backend, decode_from_prior=a[7])  # noqa: E731
    ref_out, ref_grad = run_with_grads(kla_scan_reference, {n: t.double().cpu() for n, t in x.items()})
    out, grad = run_with_grads(fn, x)
    assert_all_close(ref_out, {n: t.cpu() for n, t in out.items()}, rtol=1e-4)
    assert_all_close(ref_grad, {n: t.cpu() for n, t in grad.items()}, rtol=1e-3)


def test_default_chunk_size_rule():
    from klalm.ops.chunked_scan import CPU_SEQUENTIAL_MIN_ELEMENTS, default_chunk_size

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert default_chunk_size(1024, CPU_SEQUENTIAL_MIN_ELEMENTS, cpu) == 1024  # busy CPU step: one chunk
    assert default_chunk_size(1024, CPU_SEQUENTIAL_MIN_ELEMENTS - 1, cpu) == 32  # ceil(√L)
    assert default_chunk_size(1000, 1 << 30, cuda) == 32
    assert default_chunk_size(1, 1, cpu) == 1


def test_public_signatures():
    import inspect

    scan_params = inspect.signature(kla_scan).parameters
    assert list(scan_params) == [*NAMES[:6], "initial_state", "backend", "decode_from_prior", "variance"]
    assert scan_params["backend"].default == "auto" and scan_params["backend"].kind is inspect.Parameter.KEYWORD_ONLY
    assert scan_params["variance"].default is True and scan_params["variance"].kind is inspect.Parameter.KEYWORD_ONLY
    assert scan_params["initial_state"].default is None and scan_params["decode_from_prior"].default is False
    logvar_params = inspect.signature(kla_scan_logvar).parameters
    assert list(logvar_params) == ["v", "logvar", *NAMES[2:6], "initial_state", *list(scan_params)[7:]][:7] + [
        "precision_floor",
        "backend",
        "decode_from_prior",
        "variance",
    ]
    assert logvar_params["precision_floor"].kind is inspect.Parameter.KEYWORD_ONLY
    step_params = inspect.signature(kla_step).parameters
    assert list(step_params) == [*NAMES[:6], "state", "decode_from_prior"]
    assert step_params["decode_from_prior"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
def test_kla_scan_logvar_matches_reference(backend):
    """Λ = 1/(softplus(log σ²) + floor) from log σ², every output and gradient (d log σ² included) in float32 against
    the float64 reference fed `precision_from_logvar` (the triton backend runs interpreted on CPU)."""
    x = make_inputs(length=13, channels=4, state=4)
    x["lambda_v"] = 3 * torch.randn(x["v"].shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    floor = 1e-4

    def ref(v, logvar, *rest):
        return kla_scan_reference(v, precision_from_logvar(logvar, floor), *rest)

    def ours(*args):
        return kla_scan_logvar(*args[:7], precision_floor=floor, backend=backend, decode_from_prior=args[7])

    ref_out, ref_grad = run_with_grads(ref, x, prior=True)
    out, grad = run_with_grads(ours, {n: t.float() for n, t in x.items()}, prior=True)
    assert_all_close(ref_out, out, rtol=1e-5)
    assert_all_close(ref_grad, grad, rtol=1e-4)


def test_kla_scan_logvar_errors():
    x = {n: t.float() for n, t in make_inputs(length=3).items()}
    args = [x[n] for n in NAMES[:6]]
    with pytest.raises(ValueError, match="precision_floor"):
        kla_scan_logvar(*args, precision_floor=0.0)
    args[1] = torch.full_like(args[1], float("nan"))
    with pytest.raises(ValueError, match="logvar breaks the rule: all values finite"):
        kla_scan_logvar(*args, precision_floor=1e-4, backend="triton")
