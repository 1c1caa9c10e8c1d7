"""klalm.tasks.streams: batches made on the device into static buffers from a step counter tensor."""

from __future__ import annotations

import random

import pytest
import torch

from klalm.tasks.a5 import prefix_products
from klalm.tasks.base import materialize
from klalm.tasks.registry import make_task
from klalm.tasks.streams import MASK32, FreshStream, SplitStream, counter_ints, mix, stream_key

CPU = torch.device("cpu")


def test_mix_on_int64_tensors_equals_python_integers():
    """The tensor path (int64, kept below 2^63) against exact Python integer arithmetic."""
    rng = random.Random(0)
    values = [0, 1, 2**16 - 1, 2**31, MASK32] + [rng.randrange(2**32) for _ in range(2000)]
    got = mix(torch.tensor(values, dtype=torch.long)).tolist()
    assert got == [mix(v) for v in values]
    assert all(0 <= v <= MASK32 for v in got)


def test_mix_is_a_bijection_on_a_range():
    values = mix(torch.arange(1 << 18))
    assert values.unique().numel() == 1 << 18


def test_counter_ints_are_uniform():
    """Chi-square of 60 bins over 240k draws (99.9 % quantile of chi2(59) ~ 99.6), and per-bit balance."""
    draws = counter_ints(stream_key(7, 0), torch.arange(240_000), 60)
    assert draws.min() >= 0 and draws.max() < 60
    counts = torch.bincount(draws, minlength=60).double()
    expected = 240_000 / 60
    assert ((counts - expected) ** 2 / expected).sum() < 99.6
    raw = mix(mix(torch.arange(100_000)) ^ stream_key(7, 0))
    for bit in range(32):
        assert abs(((raw >> bit) & 1).double().mean().item() - 0.5) < 0.01, bit


def _a5_stream(seed=0, stream=0, batch=6, length=5, steps=100):
    return FreshStream(make_task("a5", length=length), batch, seed, stream, steps, CPU)


def test_fresh_stream_writes_a5_batches_into_its_buffers():
    stream = _a5_stream()
    pointers = (stream.inputs.data_ptr(), stream.labels.data_ptr())
    inputs, labels = stream.fill(torch.tensor(3))
    assert (inputs.data_ptr(), labels.data_ptr()) == pointers  # static buffers, as a CUDA graph needs
    assert inputs.shape == (6, 5) and inputs.min() >= 0 and inputs.max() < 60
    assert torch.equal(labels, prefix_products(inputs))  # the CPU oracle of the labels


def test_fresh_stream_is_a_function_of_seed_stream_and_step():
    a, b = _a5_stream(seed=1), _a5_stream(seed=1)
    step5 = a.fill(torch.tensor(5))[0].clone()
    b.fill(torch.tensor(4))
    assert torch.equal(b.fill(torch.tensor(5))[0], step5)  # whatever was drawn before
    assert not torch.equal(a.fill(torch.tensor(6))[0], step5)
    assert not torch.equal(_a5_stream(seed=2).fill(torch.tensor(5))[0], step5)
    assert not torch.equal(_a5_stream(seed=1, stream=1).fill(torch.tensor(5))[0], step5)


def test_fresh_stream_refuses_what_it_cannot_draw():
    with pytest.raises(ValueError, match="MQARTask cannot draw fresh batches"):
        FreshStream(make_task("mqar", length=16, num_pairs=2, vocab=64), 4, 0, 0, 10, CPU)
    with pytest.raises(ValueError, match="2\\^32"):
        _a5_stream(batch=256, length=20, steps=10**6)


def test_a5_labeler_writes_the_prefix_products():
    tokens = materialize(make_task("a5", length=7), 9, 0, "test")[0]
    out = torch.empty_like(tokens)
    assert make_task("a5").labeler(CPU)(tokens, out) is out
    assert torch.equal(out, prefix_products(tokens))


def test_split_stream_covers_each_epoch_once_and_follows_the_seed():
    inputs = torch.arange(10)[:, None].repeat(1, 3)  # row i is all i
    labels = inputs + 100
    stream = SplitStream(inputs, labels, batch_size=3, seed=0, steps=9)  # 3 batches per epoch, last row dropped
    pointers = (stream.inputs.data_ptr(), stream.labels.data_ptr())
    epochs = []
    for step in range(9):
        x, y = stream.fill(torch.tensor(step))
        assert (x.data_ptr(), y.data_ptr()) == pointers and torch.equal(y, x + 100)
        epochs.append(x[:, 0].tolist())
    for epoch in range(3):
        rows = sum(epochs[3 * epoch : 3 * epoch + 3], [])
        assert len(set(rows)) == 9
    again = SplitStream(inputs, labels, batch_size=3, seed=0, steps=9)
    assert torch.equal(again.order, stream.order)
    assert not torch.equal(SplitStream(inputs, labels, 3, seed=1, steps=9).order, stream.order)
    assert SplitStream(inputs, labels, batch_size=64, seed=0, steps=2).inputs.shape == (10, 3)  # at most N rows
