"""Correctness of the synthetic task generators against explicit oracles, and determinism by seed."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch

from klalm.config_checks import MAD_TASKS
from klalm.tasks import base
from klalm.tasks.a5 import MULTIPLICATION_TABLE, PERMUTATIONS, prefix_products
from klalm.tasks.base import TaskDataset, TaskStream, materialize
from klalm.tasks.registry import TASKS, make_task

# ---------------------------------------------------------------- A5


def test_a5_group_is_the_60_even_permutations():
    assert len(PERMUTATIONS) == 60 == len(set(PERMUTATIONS))
    assert PERMUTATIONS[0] == (0, 1, 2, 3, 4)
    assert list(PERMUTATIONS) == sorted(PERMUTATIONS)  # the fixed index order: lexicographic
    odd = [p for p in itertools.permutations(range(5)) if p not in PERMUTATIONS]
    assert len(odd) == 60 and (1, 0, 2, 3, 4) in odd  # a transposition is odd
    assert sorted(MULTIPLICATION_TABLE.flatten().bincount().tolist()) == [60] * 60  # a Latin square: closed


def _track_points(tokens: list[int]) -> list[tuple[int, ...]]:
    """Oracle: the image of every point after applying tokens[0], then tokens[1], ..., one prefix at a time."""
    images, out = list(range(5)), []
    for tok in tokens:
        images = [PERMUTATIONS[tok][j] for j in images]
        out.append(tuple(images))
    return out


def test_a5_labels_are_prefix_products_by_explicit_composition():
    inputs, labels = materialize(make_task("a5", length=12), 64, seed=3, split="train")
    assert inputs.shape == labels.shape == (64, 12)
    for row in range(64):
        expected = _track_points(inputs[row].tolist())
        assert [PERMUTATIONS[t] for t in labels[row].tolist()] == expected


def test_a5_composition_order_newest_applied_last():
    first, second = (1, 2, 0, 3, 4), (0, 1, 3, 4, 2)  # two 3-cycles that do not commute
    tokens = torch.tensor([[PERMUTATIONS.index(first), PERMUTATIONS.index(second)]])
    product = PERMUTATIONS[int(prefix_products(tokens)[0, 1])]
    assert product == tuple(second[first[i]] for i in range(5))  # apply first, then second
    assert product != tuple(first[second[i]] for i in range(5))


# ---------------------------------------------------------------- MQAR


def test_mqar_answers_match_the_key_value_pairs():
    task = make_task("mqar", length=64, num_pairs=6, vocab=512)
    inputs, labels = materialize(task, 200, seed=1, split="test")
    for x, y in zip(inputs.tolist(), labels.tolist()):
        keys, values = x[0:12:2], x[1:12:2]
        assert len(set(keys)) == 6 and all(1 <= k < 256 for k in keys) and all(256 <= v < 512 for v in values)
        pairs = dict(zip(keys, values))
        scored = [t for t, label in enumerate(y) if label != -100]
        assert len(scored) == 6 and all(t >= 12 and (t - 12) % 2 == 0 for t in scored)
        assert sorted(x[t] for t in scored) == sorted(keys)  # every key queried exactly once
        assert all(y[t] == pairs[x[t]] for t in scored)


def test_mqar_gaps_follow_the_power_law():
    task = make_task("mqar", length=256, num_pairs=1, vocab=1024)
    _, labels = materialize(task, 4000, seed=0, split="test")
    gaps = ((labels != -100).float().argmax(1) - 2) // 2
    counts = torch.bincount(gaps, minlength=127).float()
    probs = task.gap_probabilities()
    assert counts[0] / 4000 == pytest.approx(float(probs[0]), abs=0.03)
    assert counts[:10].sum() > counts[-10:].sum() * 3  # short gaps much more likely


@pytest.mark.parametrize("settings", [{"length": 63}, {"length": 64, "num_pairs": 17}, {"vocab": 8}])
def test_mqar_rejects_bad_settings(settings):
    with pytest.raises(ValueError):
        make_task("mqar", **settings)


# ---------------------------------------------------------------- MAD


@pytest.mark.parametrize("name", ["mad_in_context_recall", "mad_noisy_recall"])
def test_recall_values_follow_each_sequences_map(name):
    task = make_task(name)
    inputs, labels = materialize(task, 64, seed=0, split="test")
    assert inputs.shape == (64, 127)
    num_keys = (task.vocab - task.noise_vocab) // 2
    for x, y in zip(inputs.tolist(), labels.tolist()):
        seen: dict[int, int] = {}
        for t in range(0, 126, 2):
            key, value = x[t], x[t + 1]
            if key >= 2 * num_keys:  # a noise pair
                assert value >= 2 * num_keys and y[t] == -100
                continue
            assert key < num_keys <= value < 2 * num_keys and seen.get(key, value) == value
            assert y[t] == (value if key in seen else -100)  # scored iff the key was shown before
            seen[key] = value
        assert x[-1] in seen and y[-1] == seen[x[-1]]  # the probe: a shown key, always scored


def test_recall_train_labels_are_every_next_token():
    task = make_task("mad_noisy_recall")
    inputs, labels = materialize(task, 8, seed=5, split="train")
    test_inputs, test_labels = materialize(task, 8, seed=5, split="test")
    assert (labels[:, :-1] == inputs[:, 1:]).all() and (labels != -100).all()
    assert (test_labels == -100).float().mean() > 0.5  # the test split scores only recalls


def test_noisy_recall_noise_rate():
    inputs, _ = materialize(make_task("mad_noisy_recall"), 256, seed=0, split="test")
    noise_pairs = (inputs[:, 0:126:2] >= 16).float().mean()
    assert 0.15 < noise_pairs < 0.25


def test_fuzzy_recall_scored_values_are_next_tokens_of_motifs():
    task = make_task("mad_fuzzy_recall")
    inputs, labels = materialize(task, 64, seed=0, split="test")
    assert inputs.shape == labels.shape == (64, 128)
    _, train_labels = materialize(task, 64, seed=0, split="train")
    assert (train_labels[:, :-1] == materialize(task, 64, seed=0, split="train")[0][:, 1:]).all()
    for x, y in zip(inputs.tolist(), labels.tolist()):
        scored = [t for t, label in enumerate(y) if label != -100]
        assert scored and scored[-1] == 127  # the probe's value ends the sequence
        assert all(7 <= y[t] < 15 for t in scored)  # only value tokens are scored
        assert all(y[t] == x[t + 1] for t in scored if t < 127)
        pad = next(i for i, tok in enumerate(x) if tok != 15)
        assert all(tok != 15 for tok in x[pad:])  # padding only on the left


def test_selective_copy_layout():
    task = make_task("mad_selective_copy", length=64, num_copy=8)
    inputs, labels = materialize(task, 32, seed=0, split="test")
    for x, y in zip(inputs.tolist(), labels.tolist()):
        data = [tok for tok in x[:55] if tok != 14]
        assert len(data) == 8 and x[55] == 15 and x[56:] == [14] * 8
        assert y[56:] == data and y[:56] == [-100] * 56


def test_compression_and_memorization_layouts():
    inputs, labels = materialize(make_task("mad_compression"), 16, seed=0, split="test")
    assert (inputs[:, -1] == 15).all() and (inputs[:, :-1] < 15).all() and torch.equal(inputs, labels)
    task = make_task("mad_memorization")
    value_of = task.value_map()
    assert value_of.unique().numel() == 127 and value_of.min() >= 127 and value_of.max() < 255
    for seed, split in [(0, "train"), (9, "test")]:
        x, y = materialize(task, 16, seed=seed, split=split)
        assert (x[:, 1::2] == 255).all() and torch.equal(y[:, 1::2], value_of[x[:, 0::2]])
        assert (y[:, 0::2] == -100).all()


# ---------------------------------------------------------------- determinism and the registry


@pytest.mark.parametrize("name", sorted(TASKS))
def test_determinism_by_seed(name):
    task = make_task(name, length=32) if name in ("a5", "mqar") else make_task(name)
    a = materialize(task, 8, seed=7, split="test")
    b = materialize(task, 8, seed=7, split="test")
    c = materialize(task, 8, seed=8, split="test")
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert a[0].dtype == a[1].dtype == torch.long and a[0].shape == (8, task.seq_len)
    assert a[0].min() >= 0 and a[0].max() < task.vocab_size and (a[1] != -100).any()


def test_datasets_are_views_of_the_same_examples():
    task = make_task("mqar", length=32, num_pairs=2, vocab=64)
    inputs, labels = materialize(task, 600, seed=2, split="train")
    dataset = TaskDataset(task, 600, seed=2, split="train")
    assert len(dataset) == 600
    for index in (0, 511, 512, 599, -1):
        item = dataset[index]
        assert torch.equal(item["input_ids"], inputs[index]) and torch.equal(item["labels"], labels[index])
    stream = iter(TaskStream(task, seed=2, split="train"))
    assert all(torch.equal(next(stream)["input_ids"], inputs[i]) for i in range(3))
    with pytest.raises(IndexError):
        dataset[600]
    test_inputs, _ = materialize(task, 8, seed=2, split="test")
    assert not torch.equal(test_inputs, inputs[:8])


def test_materialize_does_not_depend_on_its_thread_count(monkeypatch):
    task = make_task("mqar", length=32, num_pairs=2, vocab=64)
    monkeypatch.setattr(base, "MATERIALIZE_THREADS", 1)
    one = materialize(task, 1300, seed=4, split="train")  # three chunks, the last one short
    monkeypatch.setattr(base, "MATERIALIZE_THREADS", 3)
    three = materialize(task, 1300, seed=4, split="train")
    assert all(torch.equal(u, v) for u, v in zip(one, three)) and one[0].shape == (1300, 32)


def test_each_mad_name_is_paired_with_the_class_it_names():
    """The registry pairs MAD_TASKS (klalm.config_checks, read without torch) with the classes by order: a name added,
    moved or renamed in one list and not the other would build another task under that name."""
    assert len(MAD_TASKS) == 6
    for name in MAD_TASKS:
        words = re.findall("[A-Z][a-z]*", TASKS[name].__name__.removesuffix("Task"))
        assert name == "mad_" + "_".join(word.lower() for word in words), (name, TASKS[name].__name__)


def test_registry_errors():
    with pytest.raises(KeyError, match="mad_compression"):
        make_task("mad_compress")
    with pytest.raises(ValueError, match="split"):
        TaskDataset(make_task("a5"), 4, split="valid")


@pytest.mark.parametrize("split", ["train", "test"])
def test_fuzzy_recall_pairs_keep_one_value_per_key_and_probe_a_shown_key(split):
    task = make_task("mad_fuzzy_recall")
    rng = np.random.default_rng(0)
    for _ in range(50):
        pairs = task.pairs(rng, split)
        assert sum(len(k) + len(v) for k, v in pairs) <= task.length + 1
        mapping: dict = {}
        for key, value in pairs:
            assert mapping.setdefault(key, value) == value  # a key keeps its value motif within a sequence
            assert all(t < 7 for t in key) and all(7 <= t < 15 for t in value)
            assert len(set(key)) == len(key) and 1 <= len(value) <= 3
            assert len(key) == 3 if split == "test" else 1 <= len(key) <= 3
        assert pairs[-1][0] in {k for k, _ in pairs[:-1]}  # the probe's key is in the context


def test_fuzzy_recall_scores_exactly_the_values_of_repeated_keys():
    task = make_task("mad_fuzzy_recall", length=48)
    inputs, labels = task.sample(1, torch.Generator().manual_seed(0), "test")
    # rebuild the expected labels from an independent draw with the same generator state
    rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=torch.Generator().manual_seed(0))))
    pairs = task.pairs(rng, "test")
    seq, expected, seen = [], [], set()
    for key, value in pairs:
        seq += [*key, *value]
        expected += [-100] * len(key) + (list(value) if key in seen else [-100] * len(value))
        seen.add(key)
    assert inputs[0, -(len(seq) - 1) :].tolist() == seq[:-1]
    assert labels[0, -(len(seq) - 1) :].tolist() == expected[1:]


def test_stream_workers_take_interleaved_chunks():
    from torch.utils.data import DataLoader

    task = make_task("a5", length=4)
    loader = DataLoader(TaskStream(task, seed=4), batch_size=512, num_workers=2)
    batches = [b["input_ids"] for _, b in zip(range(2), loader)]
    reference, _ = materialize(task, 1024, seed=4, split="train")  # chunks 0 and 1
    assert torch.equal(torch.cat(batches), reference)  # worker 0 reads chunk 0, worker 1 chunk 1
