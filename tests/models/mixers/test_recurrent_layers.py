"""Mamba and GDN mixers: the torch path equals the reference inside the layer, and decode equals the forward.

Both run in float64 at tight tolerances; one row per mixer: (factory, width D, length L, prefill length).
"""

from __future__ import annotations

import pytest
import torch

from klalm.models.mixers.gdn import GatedDeltaNetMixer
from klalm.models.mixers.mamba import MambaMixer

LAYERS = {
    "mamba": (lambda **o: MambaMixer(24, layer_idx=1, **o), 24, 19, 8),
    "gdn": (lambda **o: GatedDeltaNetMixer(32, layer_idx=1, **{"n_heads": 2, "chunk_size": 8, **o}), 32, 21, 10),
}


def _setup(name: str, **options):
    factory, width, length, prefill = LAYERS[name]
    torch.manual_seed(0)
    mixer = factory(**options).double()
    x = torch.randn(2, length, width, dtype=torch.float64, generator=torch.Generator().manual_seed(1))  # [B, L, D]
    return mixer, x, prefill


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_torch_backend_matches_reference_in_the_layer(name):
    mixer, x, _ = _setup(name, backend="reference")
    x.requires_grad_()
    y_ref, state_ref = mixer(x)
    grads_ref = torch.autograd.grad(y_ref.square().sum(), [x, *mixer.parameters()])
    mixer.backend = "torch"
    y, state = mixer(x)
    grads = torch.autograd.grad(y.square().sum(), [x, *mixer.parameters()])
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(tuple(state), tuple(state_ref), rtol=1e-10, atol=1e-10)
    for (param_name, _), g, g_ref in zip([("x", x), *mixer.named_parameters()], grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9, msg=lambda m, n=param_name: f"grad {n}: {m}")


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_prefill_then_decode_equals_full_forward(name):
    mixer, x, prefill = _setup(name)
    y, final = mixer(x)
    y_pre, state = mixer(x[:, :prefill])
    steps = [y_pre]
    for t in range(prefill, x.shape[1]):
        y_t, state = mixer(x[:, t : t + 1], state)
        steps.append(y_t)
    torch.testing.assert_close(torch.cat(steps, 1), y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(tuple(state), tuple(final), rtol=1e-10, atol=1e-10)
