"""The backbone for every arch: forward/backward, layer layout, init table, tied head, uncertainty readouts."""

from __future__ import annotations

import math

import pytest
import torch

from klalm.models import ARCH_LAYOUTS, build_model, prepare_backends
from klalm.models.backbone import INIT_RULES, KLALM, RMSNorm
from klalm.ops import backends

ARCHS = sorted(ARCH_LAYOUTS)
V = 64


def _tiny(arch: str, **overrides):
    torch.manual_seed(0)
    return build_model(arch, preset="tiny", vocab_size=V, **overrides)


def _ids(batch: int = 2, length: int = 10) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_backward(arch):
    model = _tiny(arch)
    ids = _ids()
    out = model(ids, labels=ids)
    assert out.logits.shape == (2, 10, V)
    assert out.loss.ndim == 0 and math.isfinite(out.loss.item())
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"{arch}: parameters without gradient: {missing}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_initial_loss_is_near_uniform():
    """GPT-2 init: logits start small, so the loss starts near ln(V)."""
    model = _tiny("gpt")
    ids = _ids()
    assert abs(model(ids, labels=ids).loss.item() - math.log(V)) < 0.1


@pytest.mark.parametrize(
    "arch, overrides, expected",
    [
        ("gpt", {}, ["attention"] * 4),
        ("kla", {}, ["kla"] * 4),
        ("mamba", {}, ["mamba"] * 4),
        ("gdn", {}, ["gdn"] * 4),
        ("gpt_kla", {}, ["attention", "attention", "attention", "kla"]),
        ("gpt_kla", {"kla_layers": [0, -2]}, ["kla", "attention", "kla", "attention"]),
    ],
)
def test_layer_layout(arch, overrides, expected):
    model = _tiny(arch, n_layers=4, **overrides)
    assert model.config.layer_mixers == expected
    assert [block.mixer_name for block in model.model.layers] == expected
    assert [type(block.mixer).__name__ for block in model.model.layers] == [
        {"attention": "Attention", "kla": "KLAMixer", "mamba": "MambaMixer", "gdn": "GatedDeltaNetMixer"}[n]
        for n in expected
    ]


def test_tied_head_is_the_embedding():
    model = _tiny("gpt")
    assert model.model.lm_head.weight is model.model.embed.weight
    untied = _tiny("gpt", tie_word_embeddings=False)
    assert untied.model.lm_head.weight is not untied.model.embed.weight
    n_tied = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in untied.parameters()) == n_tied + V * 64


def test_init_table_stds():
    """Residual projections get σ/√(2N), other matched weights σ, norms 1 (checked at a size where stds are stable)."""
    torch.manual_seed(0)
    model = build_model("gpt", d_model=256, n_layers=8, d_ff=512, n_heads=4, vocab_size=4096)
    sigma = model.config.initializer_range
    params = dict(model.named_parameters())
    resid = torch.cat(
        [
            params[f"model.layers.{i}.{n}"].flatten()
            for i in range(8)
            for n in ("mixer.out_proj.weight", "mlp.w_down.weight")
        ]
    )
    assert resid.std().item() == pytest.approx(sigma / math.sqrt(16), rel=0.03)
    assert params["model.embed.weight"].std().item() == pytest.approx(sigma, rel=0.03)
    assert params["model.layers.3.mixer.qkv_proj.weight"].std().item() == pytest.approx(sigma, rel=0.03)
    assert params["model.layers.3.mlp.w_gate.weight"].std().item() == pytest.approx(sigma, rel=0.03)
    assert all(torch.equal(m.weight, torch.ones_like(m.weight)) for m in model.modules() if isinstance(m, RMSNorm))


def test_init_rules_match_real_parameter_names():
    """Every rule of the table matches at least one parameter of some arch (no stale patterns)."""
    import re

    names = {n for arch in ARCHS for n, _ in KLALM(_tiny(arch, tie_word_embeddings=False).config).named_parameters()}
    stale = [pattern for pattern, _ in INIT_RULES if not any(re.search(pattern, n) for n in names)]
    assert not stale


@pytest.mark.parametrize("arch", ["kla", "gpt_kla"])
def test_variance_readout(arch):
    model = _tiny(arch).eval()
    ids = _ids()
    plain = model(ids).logits
    out = model(ids, return_variance=True)
    torch.testing.assert_close(out.logits, plain)  # the mean path is the ordinary forward
    assert out.variance.shape == (2, 10, 64) and (out.variance >= 0).all() and out.variance.sum() > 0
    assert out.mc_probs is None


def test_variance_is_that_of_the_last_kla_layer():
    model = _tiny("gpt_kla", n_layers=3, kla_layers=[0, 1]).eval()
    assert model.model.variance_layer == 1
    ids = _ids()
    captured = {}
    mixer = model.model.layers[1].mixer
    orig = mixer.forward

    def spy(x, state=None, **kwargs):
        result = orig(x, state, **kwargs)
        captured["var"] = result[2]
        return result

    mixer.forward = spy
    out = model(ids, return_variance=True)
    torch.testing.assert_close(out.variance, captured["var"])


def test_mc_readout_is_a_distribution_and_averages_samples():
    model = _tiny("kla").eval()
    ids = _ids()
    torch.manual_seed(5)
    out = model(ids, mc_samples=3)
    assert out.mc_probs.shape == (2, 10, V) and out.mc_probs.dtype == torch.float32
    torch.testing.assert_close(out.mc_probs.sum(-1), torch.ones(2, 10))
    # the same seed reproduces it; the mean-only softmax differs from the MC average (samples have spread)
    torch.manual_seed(5)
    torch.testing.assert_close(model(ids, mc_samples=3).mc_probs, out.mc_probs)
    assert not torch.allclose(out.mc_probs, torch.softmax(out.logits.float(), -1), atol=1e-7)


def test_mc_readout_with_zero_variance_is_the_softmax():
    """If the KLA output variance is 0 every sample equals the mean, so the MC readout is softmax(logits)."""
    model = _tiny("kla").eval()
    mixer = model.model.layers[-1].mixer
    orig = mixer.forward
    mixer.forward = lambda x, state=None, **kw: (*orig(x, state, **kw)[:2], torch.zeros_like(x))
    out = model(_ids(), mc_samples=2)
    torch.testing.assert_close(out.mc_probs, torch.softmax(out.logits.float(), -1))


def test_uncertainty_needs_a_kla_layer():
    with pytest.raises(ValueError, match="need a KLA layer"):
        _tiny("gpt")(_ids(), return_variance=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_weights_track_float32(arch):
    model = _tiny(arch).eval()
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
        low = model.to(torch.bfloat16)(ids).logits
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ref, rtol=0, atol=0.05 * ref.abs().max().item())


@pytest.mark.parametrize("arch", ["kla", "gpt_kla"])
def test_lm_with_the_triton_scan_traces_as_one_graph(arch):
    """torch.compile sees a whole KLA language model (loss included) as one graph: the Triton scan is a custom op
    (interpreted on CPU), and nothing else in the backbone breaks the trace."""
    import torch._dynamo

    torch._dynamo.reset()
    model = build_model(arch, preset="tiny", vocab_size=256, mixer_options={"kla": {"backend": "triton"}})
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    explanation = torch._dynamo.explain(model)(ids, labels=ids)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons


@pytest.mark.parametrize("arch", ARCHS)
def test_every_lm_with_its_default_backends_compiles_as_one_graph(arch, monkeypatch):
    """A model with its default ("auto") backends, compiled before any op has made its choice, as `LMModule` and the
    synthetic trainer compile it (`prepare_backends` first): one graph a forward, loss included. A backend choice
    logged inside the trace, or the RoPE table built in a `torch.compiler.disable`d function, had split a compiled
    45M model into 38-44 graphs a forward."""
    import torch._dynamo

    monkeypatch.setattr(backends, "_AUTO", {})  # no choice made yet, as in a fresh process
    torch._dynamo.reset()
    model = _tiny(arch).train()
    prepare_backends(model, "cpu")
    ids = _ids(length=140)  # more than one chunk of every chunked path
    explanation = torch._dynamo.explain(model)(ids, labels=ids)
    torch._dynamo.reset()
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons


@pytest.mark.slow  # inductor's C++ code generation: 15-55 s a model on 2 cores
@pytest.mark.parametrize("arch", ARCHS)
def test_inductor_compiled_lm_matches_eager_on_the_cpu(arch):
    """The whole LM through inductor in one graph (fullgraph), its backends prepared first: loss and every gradient
    as eager. (On CUDA, with bf16 autocast: tests/models/test_gpu.py.)"""
    import torch._dynamo

    ids, runs = _ids(length=70), []
    for compiled in (False, True):
        torch._dynamo.reset()
        model = _tiny(arch).train()
        prepare_backends(model, "cpu")
        loss = (torch.compile(model, fullgraph=True) if compiled else model)(ids, labels=ids).loss
        loss.backward()
        runs.append((loss.detach(), {name: p.grad for name, p in model.named_parameters()}))
    torch._dynamo.reset()
    (loss, grads), (loss_c, grads_c) = runs
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-6)
    for name, grad in grads.items():
        err = ((grads_c[name] - grad).norm() / grad.norm().clamp_min(1e-12)).item()
        assert err <= 1e-4, f"{name}: relative error {err:.2e}"
