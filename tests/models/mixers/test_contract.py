"""The mixer contract (mixers/base.py), checked for every entry of MIXERS in float64 on random inputs."""

from __future__ import annotations

import pytest
import torch

from klalm.models.mixers import MIXERS, Mixer, lookup

D = 32
OPTIONS = {"attention": {"n_heads": 4}}  # small sizes the defaults of the others already fit


def _mixer(name: str) -> Mixer:
    torch.manual_seed(0)
    return MIXERS[name](D, layer_idx=0, **OPTIONS.get(name, {})).double().eval()


def _x(batch: int = 2, length: int = 11) -> torch.Tensor:
    return torch.randn(batch, length, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_shape_and_subclass(name):
    mixer = _mixer(name)
    assert isinstance(mixer, Mixer) and mixer.d_model == D
    y, state = mixer(_x())
    assert y.shape == (2, 11, D) and y.dtype == torch.float64
    assert state is not None


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_causal(name):
    """The output at t does not change when inputs after t change."""
    mixer, x = _mixer(name), _x()
    t = 5
    x2 = x.clone()
    x2[:, t + 1 :] += torch.randn_like(x2[:, t + 1 :])
    y, _ = mixer(x)
    y2, _ = mixer(x2)
    torch.testing.assert_close(y[:, : t + 1], y2[:, : t + 1], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(y[:, t + 1 :], y2[:, t + 1 :])


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_state_carry(name):
    """Two calls that pass the state along equal one call on the whole sequence."""
    mixer, x = _mixer(name), _x()
    y, _ = mixer(x)
    y1, state = mixer(x[:, :4])
    y2, _ = mixer(x[:, 4:], state)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_token_by_token_from_init_state(name):
    """Decoding one token at a time from init_state reproduces the full forward."""
    mixer, x = _mixer(name), _x(length=7)
    y, _ = mixer(x)
    state = mixer.init_state(2, x.device, x.dtype)
    steps = []
    for t in range(x.shape[1]):
        y_t, state = mixer(x[:, t : t + 1], state)
        steps.append(y_t)
    torch.testing.assert_close(torch.cat(steps, dim=1), y, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_backward_reaches_every_parameter(name):
    mixer = _mixer(name).train()
    x = _x().requires_grad_()
    y, _ = mixer(x)
    y.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    missing = [n for n, p in mixer.named_parameters() if p.grad is None]
    assert not missing, f"{name}: no gradient for {missing}"


def test_lookup_lists_valid_names():
    with pytest.raises(KeyError, match="attention.*gdn.*kla.*mamba"):
        lookup("transformer")
