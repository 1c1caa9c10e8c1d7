"""GatedDeltaNetMixer: state, sizes, init ranges, marks, bf16, bad options (decode: test_recurrent_layers.py)."""

from __future__ import annotations

import pytest
import torch

from klalm.models.mixers.gdn import GatedDeltaNetMixer, GDNState

D = 32


def _mixer(**options) -> GatedDeltaNetMixer:
    torch.manual_seed(0)
    return GatedDeltaNetMixer(D, layer_idx=1, **{"n_heads": 2, "chunk_size": 8, **options}).double()


def _x(batch=2, length=21, seed=1):
    return torch.randn(batch, length, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_state_shapes_and_init_state():
    mixer = _mixer(head_dim=4, expand_v=3, d_conv=2)
    state = mixer.init_state(3, torch.device("cpu"), torch.float64)
    assert isinstance(state, GDNState)
    assert state.conv.shape == (3, 2 * 8 + 24, 1) and state.recurrent.shape == (3, 2, 4, 12)
    y, new = mixer(_x(batch=3, length=1), state)
    assert y.shape == (3, 1, D) and new.recurrent.shape == state.recurrent.shape


@pytest.mark.parametrize(("d_model", "heads"), [(32, 2), (64, 6), (512, 6)])
def test_parameter_count_formula(d_model, heads):
    mixer = GatedDeltaNetMixer(d_model, n_heads=heads)
    v = 2 * (3 * d_model // 4) // heads
    assert mixer.head_k_dim * heads == 3 * d_model // 4 and mixer.head_v_dim == v
    want = 6 * d_model**2 + 3 * d_model * 4 + 2 * d_model * heads + 2 * heads + v
    assert sum(p.numel() for p in mixer.parameters()) == want


def test_decay_and_gate_ranges_at_init():
    mixer = _mixer()
    a = torch.exp(mixer.A_log)
    assert a.min() >= 1.0 and a.max() <= 16.0
    dt = torch.nn.functional.softplus(mixer.dt_bias)
    assert dt.min() >= 1e-4 and dt.max() <= 0.1 + 1e-6


def test_no_weight_decay_marks():
    marked = {name for name, p in _mixer().named_parameters() if getattr(p, "_no_weight_decay", False)}
    assert marked == {"A_log", "dt_bias"}


def test_bfloat16_forward_backward():
    mixer = GatedDeltaNetMixer(D, n_heads=2).bfloat16()
    x = torch.randn(2, 9, D, dtype=torch.bfloat16, requires_grad=True)
    y, state = mixer(x)
    y.float().square().sum().backward()
    assert y.dtype == torch.bfloat16 and state.recurrent.dtype == torch.float32
    assert all(torch.isfinite(p.grad).all() for p in mixer.parameters())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_head": 2}, r"unknown GatedDeltaNetMixer option\(s\) \['num_head'\]"),
        ({"n_heads": 5}, "not divisible by n_heads=5; set head_dim"),
        ({"head_dim": 0}, "head_dim must be a positive integer"),
        ({"expand_v": 0}, "expand_v must be a positive integer"),
        ({"backend": "cuda"}, "backend='cuda' is unknown"),
        ({"A_init_range": (0.0, 16.0)}, "A_init_range"),
        ({"chunk_size": 0}, "chunk_size must be a positive integer"),
    ],
)
def test_bad_options_raise_naming_the_key(options, message):
    with pytest.raises(ValueError, match=message):
        GatedDeltaNetMixer(D, **options)


def test_bad_input_shape_raises():
    with pytest.raises(ValueError, match=r"GatedDeltaNetMixer expects x \[B, L, 32\]"):
        _mixer()(torch.randn(2, 5, D - 1))


@pytest.mark.gpu
def test_cuda_auto_backend_matches_torch_backend():
    mixer = GatedDeltaNetMixer(64).cuda()
    x = torch.randn(2, 300, 64, device="cuda", requires_grad=True)
    y_auto, _ = mixer(x)
    (g_auto,) = torch.autograd.grad(y_auto.square().sum(), x)
    mixer.backend = "torch"
    y, _ = mixer(x)
    (g,) = torch.autograd.grad(y.square().sum(), x)
    torch.testing.assert_close((y_auto, g_auto), (y, g), rtol=2e-3, atol=2e-3)
