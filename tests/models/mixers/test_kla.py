"""KLAMixer: both blocks × discretisations, decode == full forward, variance, marks, parameter formula."""

from __future__ import annotations

import math

import pytest
import torch

from klalm.models.mixers.base import Mixer
from klalm.models.mixers.kla import KLAMixer, KLAMixerState

D, B, L = 16, 2, 11
VARIANTS = [
    dict(block="plain", discretization="ou"),
    dict(block="plain", discretization="zoh"),
    dict(block="mamba", discretization="ou"),
    dict(block="mamba", discretization="zoh"),
    dict(block="mamba", zero_process_noise=True),
    dict(block="plain", decode_from_prior=True),
]


def _id(opts):
    return "-".join(f"{k}={v}" for k, v in opts.items())


def make(opts, dtype=torch.float64, d_state=4, **extra):
    torch.manual_seed(0)
    return KLAMixer(D, d_state=d_state, **opts, **extra).to(dtype)


@pytest.mark.parametrize("opts", VARIANTS, ids=_id)
def test_forward_backward_shapes_and_grads(opts):
    mixer = make(opts, dtype=torch.float32)
    assert isinstance(mixer, Mixer)
    x = torch.randn(B, L, D, requires_grad=True)
    y, state = mixer(x)
    assert y.shape == (B, L, D) and isinstance(state, KLAMixerState)
    assert state.conv.shape == (B, 2 * D, 3) and state.filter.lam.shape == (B, 2 * D, 4)
    y.square().mean().backward()
    for name, param in mixer.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, f"{name} gets no gradient"


@pytest.mark.parametrize("opts", VARIANTS, ids=_id)
def test_token_by_token_decode_equals_full_forward(opts):
    mixer = make(opts)
    x = torch.randn(B, L, D, dtype=torch.float64)
    with torch.no_grad():
        full, full_state = mixer(x)
        y_prefill, state = mixer(x[:, :5])  # prefill, then O(1) steps from the carried state
        steps = [y_prefill]
        for t in range(5, L):
            y_t, state = mixer(x[:, t : t + 1], state)
            steps.append(y_t)
        fresh = mixer.init_state(B, x.device, x.dtype)
        y_first, _ = mixer(x[:, :1], fresh)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state.filter.lam, full_state.filter.lam)
    torch.testing.assert_close(state.conv, full_state.conv)
    torch.testing.assert_close(y_first, full[:, :1], rtol=1e-10, atol=1e-10)


def test_chunked_prefill_equals_full_forward():
    mixer = make(dict(block="mamba"))
    x = torch.randn(B, L, D, dtype=torch.float64)
    with torch.no_grad():
        full, _ = mixer(x)
        y1, state = mixer(x[:, :2])  # shorter than the conv window
        y2, state = mixer(x[:, 2:7], state)
        y3, _ = mixer(x[:, 7:], state)
    torch.testing.assert_close(torch.cat([y1, y2, y3], 1), full, rtol=1e-10, atol=1e-10)


def test_decode_uses_kla_step(monkeypatch):
    import klalm.models.mixers.kla as kla_module

    calls = []
    real_step = kla_module.kla_step
    monkeypatch.setattr(kla_module, "kla_step", lambda *a, **k: calls.append(1) or real_step(*a, **k))
    mixer = make(dict(block="mamba"))
    mixer(torch.randn(B, 1, D, dtype=torch.float64), mixer.init_state(B, "cpu", torch.float64))
    assert calls == [1]


@pytest.mark.parametrize("block", ["plain", "mamba"])
def test_variance_output(block):
    mixer = make(dict(block=block))
    x = torch.randn(B, L, D, dtype=torch.float64)
    y, _, y_var = mixer(x, return_variance=True)
    assert y_var.shape == (B, L, D) and (y_var > 0).all()
    # the same quantity computed by hand from the scan's variance
    z, g = mixer.in_proj(x).chunk(2, dim=-1)
    z, _ = mixer._conv(z, None)
    v, logvar, k, q = mixer._sensors(z)
    a, p = mixer.dynamics()
    from klalm.models.mixers.kla import PRECISION_FLOOR
    from klalm.ops import kla_scan

    lambda_v = 1.0 / (torch.nn.functional.softplus(logvar) + PRECISION_FLOOR)
    _, scan_var, _ = kla_scan(v, lambda_v, k, q, a, p, backend="reference")
    expected = (scan_var * torch.nn.functional.silu(g) ** 2) @ (mixer.out_proj.weight**2).T
    torch.testing.assert_close(y_var, expected)


@pytest.mark.parametrize("block", ["plain", "mamba"])
def test_backends_agree_inside_the_layer(block):
    x = torch.randn(B, L, D, dtype=torch.float64)
    ref = make(dict(block=block), backend="reference")
    fast = make(dict(block=block), backend="torch")
    torch.testing.assert_close(fast(x)[0], ref(x)[0], rtol=1e-10, atol=1e-10)
    for mixer in (ref, fast):
        y, _, y_var = mixer(x, return_variance=True)
        (y.sin().sum() + y_var.sum()).backward()
    for (name, p_ref), (_, p_fast) in zip(ref.named_parameters(), fast.named_parameters()):
        torch.testing.assert_close(p_fast.grad, p_ref.grad, rtol=1e-9, atol=1e-12, msg=name)


LAYER_CASES = [(dict(block="plain"), 4), (dict(block="mamba", decode_from_prior=True), 4), (dict(block="plain"), 64)]


@pytest.mark.parametrize("opts,d_state", LAYER_CASES, ids=[f"{_id(o)}-S{s}" for o, s in LAYER_CASES])
def test_triton_backend_inside_the_layer(opts, d_state):
    """The Triton kernels (interpreted on CPU; Λ formed inside them from log σ²; d_state 64 as four scans of 16 key
    dimensions, its default) give the torch backend's outputs and parameter gradients in float32."""
    x = torch.randn(B, L, D)
    fast = make(opts, torch.float32, d_state, backend="triton")
    ref = make(opts, torch.float32, d_state, backend="torch")
    for mixer in (ref, fast):
        y, _, y_var = mixer(x, return_variance=True)
        (y.sin().sum() + y_var.sum()).backward()
    torch.testing.assert_close(fast(x)[0], ref(x)[0], rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # evaluation: no chunk states saved (the ops' outputs must still not alias each other)
        torch.testing.assert_close(fast(x)[0], ref(x)[0], rtol=1e-5, atol=1e-6)
    for (name, p_ref), (_, p_fast) in zip(ref.named_parameters(), fast.named_parameters()):
        torch.testing.assert_close(p_fast.grad, p_ref.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("d_state", [4, 64], ids=["S4", "S64-sliced"])
def test_torch_compile_traces_the_layer_without_graph_breaks(d_state):
    """On the Triton backend (custom ops klalm::kla_scan_fwd/bwd; interpreted on CPU) dynamo captures the whole
    layer as one graph, and the compiled layer (AOTAutograd, backend aot_eager: no C++ compiler needed) gives the
    eager outputs and parameter gradients; also where the ops run the state in slices (d_state 64)."""
    import torch._dynamo

    torch._dynamo.reset()
    mixer = make(dict(block="mamba"), torch.float32, d_state, backend="triton")
    x = torch.randn(1, 6, D)  # graph capture and compiled-vs-eager need no long input; each interpreted step costs
    explanation = torch._dynamo.explain(mixer)(x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    y, _ = mixer(x)
    y.square().sum().backward()
    eager = {name: p.grad.clone() for name, p in mixer.named_parameters()}
    mixer.zero_grad()
    y_compiled, _ = torch.compile(mixer, backend="aot_eager", fullgraph=True)(x)
    y_compiled.square().sum().backward()
    torch.testing.assert_close(y_compiled, y, rtol=1e-6, atol=1e-7)
    for name, p in mixer.named_parameters():
        torch.testing.assert_close(p.grad, eager[name], rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("zero_noise", [False, True])
def test_no_weight_decay_marks(zero_noise):
    mixer = make(dict(block="mamba", zero_process_noise=zero_noise))
    marked = {n for n, p in mixer.named_parameters() if getattr(p, "_no_weight_decay", False)}
    expected = {"alpha_log", "delta", "skip"} | (set() if zero_noise else {"p_c"})
    assert marked == expected
    assert mixer.alpha_log.shape == mixer.delta.shape == (2 * D, 4)


def test_dynamics_init_and_discretisations():
    mixer = make(dict(block="mamba", discretization="ou"), dt_min=1e-3, dt_max=1e-1, noise_init=0.01)
    step = torch.nn.functional.softplus(mixer.delta)
    assert step.min() >= 1e-3 * (1 - 1e-9) and step.max() <= 1e-1 * (1 + 1e-9)
    a, p = mixer.dynamics()
    torch.testing.assert_close(a, torch.exp(-step))  # |α| = 1 at init
    torch.testing.assert_close(p, 0.01 / 2 * (1 - torch.exp(-2 * step)))
    mixer.discretization = "zoh"
    torch.testing.assert_close(mixer.dynamics()[1], 0.01 * step)
    zero = make(dict(block="mamba", zero_process_noise=True))
    assert torch.equal(zero.dynamics()[1], torch.zeros_like(a))


def expected_params(d, expand, s, k, block, zero_noise=False):
    m, r = expand * d, math.ceil(d / 8)
    core = 3 * d * m + 5 * m * s + 1 - (m * s if zero_noise else 0)
    if block == "plain":
        return core + 2 * m * m + (k + 3) * m
    return core + 2 * m * r + (k + 2) * m


@pytest.mark.parametrize("block", ["plain", "mamba"])
@pytest.mark.parametrize("d,expand,s,k,zero", [(16, 2, 4, 4, False), (24, 3, 8, 3, True), (512, 2, 16, 4, False)])
def test_parameter_count_formula(block, d, expand, s, k, zero):
    mixer = KLAMixer(d, d_state=s, expand=expand, d_conv=k, block=block, zero_process_noise=zero)
    assert sum(p.numel() for p in mixer.parameters()) == expected_params(d, expand, s, k, block, zero)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(block="transformer"), "unknown KLA block 'transformer'; valid: \\['mamba', 'plain'\\]"),
        (dict(discretization="euler"), "unknown discretization 'euler'"),
        (dict(d_state=0), "d_state must be >= 1"),
        (dict(dt_min=0.2, dt_max=0.1), "dt_min"),
        (dict(noise_init=-1.0), "noise_init"),
    ],
)
def test_bad_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KLAMixer(D, **kwargs)


def test_bad_backend_raises_on_forward():
    mixer = make(dict(block="mamba"), backend="fastest")
    with pytest.raises(ValueError, match="unknown kla_scan backend 'fastest'"):
        mixer(torch.randn(B, 3, D, dtype=torch.float64))


def test_bf16_activations():
    mixer = make(dict(block="mamba"), dtype=torch.bfloat16)
    x = torch.randn(B, L, D, dtype=torch.bfloat16, requires_grad=True)
    y, state, y_var = mixer(x, return_variance=True)
    assert y.dtype == torch.bfloat16 and state.filter.lam.dtype == torch.float32
    y.float().sum().backward()
    assert torch.isfinite(x.grad.float()).all() and torch.isfinite(y_var.float()).all()
