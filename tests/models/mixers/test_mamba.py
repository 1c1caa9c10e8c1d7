"""MambaMixer: state shapes, sizes, marks, bf16 and bad options (decode: test_recurrent_layers.py)."""

from __future__ import annotations

import math

import pytest
import torch

from klalm.models.mixers.mamba import MambaMixer, MambaState

D = 24


def _mixer(**options) -> MambaMixer:
    torch.manual_seed(0)
    return MambaMixer(D, layer_idx=1, **options).double()


def _x(batch=2, length=19, seed=1):
    return torch.randn(batch, length, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_state_shapes_and_init_state():
    mixer = _mixer(d_state=8, d_conv=3)
    state = mixer.init_state(3, torch.device("cpu"), torch.float64)
    assert isinstance(state, MambaState)
    assert state.conv.shape == (3, 2 * D, 2) and state.ssm.shape == (3, 2 * D, 8)
    assert not state.conv.any() and not state.ssm.any()
    y, new = mixer(_x(batch=3, length=1), state)
    assert y.shape == (3, 1, D) and new.ssm.shape == state.ssm.shape


def test_parameter_count_and_init():
    mixer = MambaMixer(D)
    m, n, r, k = 2 * D, 16, math.ceil(D / 16), 4
    assert sum(p.numel() for p in mixer.parameters()) == 3 * D * m + m * (2 * r + 3 * n + k + 3)
    torch.testing.assert_close(-torch.exp(mixer.A_log[3]), -torch.arange(1.0, n + 1))  # S4D-real
    dt = torch.nn.functional.softplus(mixer.dt_bias)
    assert dt.min() >= 1e-4 and dt.max() <= 0.1 + 1e-6


def test_no_weight_decay_marks():
    marked = {name for name, p in MambaMixer(D).named_parameters() if getattr(p, "_no_weight_decay", False)}
    assert marked == {"A_log", "D", "dt_bias"}


def test_bfloat16_forward_backward():
    mixer = MambaMixer(D).bfloat16()
    x = torch.randn(2, 9, D, dtype=torch.bfloat16, requires_grad=True)
    y, state = mixer(x)
    y.float().square().sum().backward()
    assert y.dtype == torch.bfloat16 and state.ssm.dtype == torch.float32
    assert all(torch.isfinite(p.grad).all() for p in mixer.parameters())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"d_stat": 16}, r"unknown MambaMixer option\(s\) \['d_stat'\]"),
        ({"d_state": 0}, "d_state must be a positive integer"),
        ({"expand": 1.5}, "expand must be a positive integer"),
        ({"backend": "cuda"}, "backend='cuda' is unknown"),
        ({"dt_min": 0.5, "dt_max": 0.1}, "dt_min"),
        ({"dt_rank": 0}, "dt_rank"),
    ],
)
def test_bad_options_raise_naming_the_key(options, message):
    with pytest.raises(ValueError, match=message):
        MambaMixer(D, **options)


def test_bad_input_shape_raises():
    with pytest.raises(ValueError, match=r"MambaMixer expects x \[B, L, 24\]"):
        MambaMixer(D)(torch.randn(2, 5, D + 1))


@pytest.mark.gpu
def test_cuda_auto_backend_matches_torch_backend():
    mixer = MambaMixer(64).cuda()
    x = torch.randn(2, 300, 64, device="cuda", requires_grad=True)
    y_auto, _ = mixer(x)
    (g_auto,) = torch.autograd.grad(y_auto.square().sum(), x)
    mixer.backend = "torch"
    y, _ = mixer(x)
    (g,) = torch.autograd.grad(y.square().sum(), x)
    torch.testing.assert_close((y_auto, g_auto), (y, g), rtol=1e-3, atol=1e-3)


def test_triton_backend_and_torch_compile_without_graph_breaks():
    """On the Triton backend (custom ops klalm::selective_scan_fwd/bwd; interpreted on CPU) the layer gives the torch
    backend's outputs and gradients, dynamo captures it as one graph, and the compiled layer (aot_eager) is eager's."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    fast, ref = MambaMixer(D, layer_idx=1, d_state=4, backend="triton"), MambaMixer(D, layer_idx=1, d_state=4)
    ref.load_state_dict(fast.state_dict())
    x = _x(length=8).float()  # each interpreted launch walks every step: 8 steps check what 19 did at half the cost
    outputs = []
    for mixer in (ref, fast):
        y = mixer(x)[0]
        y.square().sum().backward()
        outputs.append(y.detach())
    y_ref, y_fast = outputs
    torch.testing.assert_close(y_fast, y_ref, rtol=1e-5, atol=1e-6)
    for (name, p_ref), (_, p_fast) in zip(ref.named_parameters(), fast.named_parameters()):
        torch.testing.assert_close(p_fast.grad, p_ref.grad, rtol=1e-4, atol=1e-6, msg=name)
    explanation = torch._dynamo.explain(fast)(x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    eager = {name: p.grad.clone() for name, p in fast.named_parameters()}
    fast.zero_grad()
    y = torch.compile(fast, backend="aot_eager", fullgraph=True)(x)[0]
    y.square().sum().backward()
    torch.testing.assert_close(y, y_fast, rtol=1e-6, atol=1e-7)  # eager's output (the weights have not changed)
    for name, p in fast.named_parameters():
        torch.testing.assert_close(p.grad, eager[name], rtol=1e-6, atol=1e-7, msg=name)
