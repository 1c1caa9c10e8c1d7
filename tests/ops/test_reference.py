"""The sequential KLA reference: float64 gradcheck, the recursion by hand, and the Möbius identity."""

from __future__ import annotations

import torch

from klalm.ops.common import KLAState, compute_dtype, fresh_state
from klalm.ops.reference import kla_scan_reference, kla_step_reference


def _inputs(batch=2, length=5, channels=3, state=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(batch, length, channels, generator=g, dtype=dtype)
    lambda_v = torch.rand(batch, length, channels, generator=g, dtype=dtype) * 2 + 0.2
    k = torch.randn(batch, length, state, generator=g, dtype=dtype)
    q = torch.randn(batch, length, state, generator=g, dtype=dtype)
    a = torch.rand(channels, state, generator=g, dtype=dtype) * 0.5 + 0.5
    p = torch.rand(channels, state, generator=g, dtype=dtype) * 0.2
    lam0 = torch.rand(batch, channels, state, generator=g, dtype=dtype) + 0.5
    eta0 = torch.randn(batch, channels, state, generator=g, dtype=dtype)
    return v, lambda_v, k, q, a, p, lam0, eta0


def test_reference_gradcheck_float64():
    inputs = [x.requires_grad_() for x in _inputs(length=4)]

    def fn(v, lambda_v, k, q, a, p, lam0, eta0):
        y, y_var, state = kla_scan_reference(v, lambda_v, k, q, a, p, KLAState(lam0, eta0))
        return y, y_var, state.lam, state.eta

    assert torch.autograd.gradcheck(fn, inputs)


def test_reference_matches_hand_recursion_one_element():
    v, lambda_v, k, q, a, p, lam0, eta0 = _inputs(batch=1, length=3, channels=1, state=1)
    y, y_var, state = kla_scan_reference(v, lambda_v, k, q, a, p, KLAState(lam0, eta0))
    lam, eta = lam0.item(), eta0.item()
    a_, p_ = a.item(), p.item()
    for t in range(3):
        vt, lt, kt, qt = v[0, t, 0].item(), lambda_v[0, t, 0].item(), k[0, t, 0].item(), q[0, t, 0].item()
        d = a_**2 + p_ * lam
        lam, eta = lam / d + lt * kt**2, (a_ / d) * eta + vt * lt * kt
        assert abs(y[0, t, 0].item() - qt * eta / lam) < 1e-12
        assert abs(y_var[0, t, 0].item() - qt**2 / lam) < 1e-12
    assert abs(state.lam.item() - lam) < 1e-12 and abs(state.eta.item() - eta) < 1e-12


def test_lambda_update_is_the_mobius_map():
    _, lambda_v, k, _, a, p, lam0, _ = _inputs(batch=1, length=1)
    phi = lambda_v[:, 0, :, None] * k[:, 0, None, :] ** 2  # [B, M, S]
    big_a, big_b, big_c = (1 + p * phi) / a**2, phi, p / a**2
    mobius = (big_a * lam0 + big_b) / (big_c * lam0 + 1)
    direct = lam0 / (a**2 + p * lam0) + phi
    torch.testing.assert_close(mobius, direct, rtol=1e-12, atol=0)


def test_fresh_state_and_compute_dtype():
    state = fresh_state(2, 3, 4, "cpu")
    assert torch.equal(state.lam, torch.ones(2, 3, 4)) and torch.equal(state.eta, torch.zeros(2, 3, 4))
    assert compute_dtype(torch.bfloat16) == torch.float32 and compute_dtype(torch.float64) == torch.float64


def test_step_equals_one_scan_step():
    v, lambda_v, k, q, a, p, lam0, eta0 = _inputs(length=1)
    y, y_var, state = kla_scan_reference(v, lambda_v, k, q, a, p, KLAState(lam0, eta0))
    y1, y_var1, state1 = kla_step_reference(v[:, 0], lambda_v[:, 0], k[:, 0], q[:, 0], a, p, KLAState(lam0, eta0))
    torch.testing.assert_close(y[:, 0], y1)
    torch.testing.assert_close(y_var[:, 0], y_var1)
    torch.testing.assert_close(state.lam, state1.lam)
