"""rng_state/set_rng_state: a checkpoint's RNG state restores every generator, and CUDA's per device."""

from __future__ import annotations

import random

import numpy as np
import torch

from klalm.train import module


def test_round_trip_restores_cpu_generators():
    state = module.rng_state()
    draws = random.random(), np.random.rand(), torch.rand(3)
    module.set_rng_state(state)
    assert (random.random(), np.random.rand()) == draws[:2] and torch.equal(torch.rand(3), draws[2])


def test_cuda_state_is_the_current_devices_only(monkeypatch):
    """A checkpoint from a 2-GPU run must restore on 1 GPU: one device's generator is saved, not all of them."""
    device_state = torch.arange(8, dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: device_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", restored.append)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [device_state, device_state])  # must not be used
    state = module.rng_state()
    assert torch.equal(state["cuda"], device_state)
    module.set_rng_state(state)
    assert len(restored) == 1 and torch.equal(restored[0], device_state)
