"""The synthetic-task training loop: its pieces against plain formulas, and tiny runs that beat chance."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from klalm.models import build_model
from klalm.tasks import make_task, materialize
from klalm.tasks.train import (
    FreshBatches,
    SplitBatches,
    TrainSettings,
    evaluate,
    lr_at,
    masked_cross_entropy,
    train,
    wrap_readout,
)

CPU = torch.device("cpu")


def test_lr_schedule_warmup_then_cosine():
    s = TrainSettings(lr=1e-3, min_lr=1e-5, warmup_frac=0.1)
    assert lr_at(0.05, s) == pytest.approx(5e-4)
    assert lr_at(0.1, s) == pytest.approx(1e-3)
    assert lr_at(0.55, s) == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5))
    assert lr_at(1.0, s) == pytest.approx(1e-5)
    assert lr_at(0.0, dataclasses.replace(s, warmup_frac=0.0)) == pytest.approx(1e-3)


def test_masked_cross_entropy_matches_the_mean_over_scored_positions():
    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    labels = torch.randint(7, (3, 5))
    labels[0, :2] = labels[2, 4] = -100
    keep = labels != -100
    manual = -(logits.log_softmax(-1).gather(2, labels.clamp(min=0)[..., None])[..., 0])[keep].mean()
    assert masked_cross_entropy(logits, labels).item() == pytest.approx(manual.item())


class _Fixed(nn.Module):
    """Predicts a fixed token sequence (one-hot logits), to check the metrics."""

    def __init__(self, predictions: torch.Tensor):
        super().__init__()
        self.predictions = predictions

    def forward(self, input_ids):
        rows = self.predictions[input_ids[:, 0]]  # the first token indexes the row to predict
        return F.one_hot(rows, 4).float()


def test_evaluate_token_and_sequence_accuracy():
    predictions = torch.tensor([[1, 2, 3], [1, 2, 3], [0, 0, 0]])
    inputs = torch.tensor([[0, 0, 0], [1, 1, 1], [2, 2, 2]])
    labels = torch.tensor([[1, 2, 3], [1, -100, 0], [-100, -100, -100]])
    metrics = evaluate(_Fixed(predictions), inputs, labels, batch_size=2, device=CPU)
    assert metrics == {"token_acc": 4 / 5, "seq_acc": 1 / 2, "scored_tokens": 5}
    with pytest.raises(ValueError, match="scored"):
        evaluate(_Fixed(predictions), inputs[2:], labels[2:], batch_size=2, device=CPU)


def test_batch_sources_cover_epochs_and_are_deterministic():
    inputs, labels = torch.arange(10)[:, None], torch.arange(10)[:, None]
    batches = SplitBatches(inputs, labels, batch_size=5, seed=0)
    epoch = torch.cat([batches(step)[0] for step in range(2)]).flatten()
    assert sorted(epoch.tolist()) == list(range(10))
    task = make_task("a5", length=4)
    a, b = FreshBatches(task, 3, seed=1, device=CPU), FreshBatches(task, 3, seed=1, device=CPU)
    assert torch.equal(a(5)[0], b(5)[0]) and not torch.equal(a(5)[0], a(6)[0])


def test_time_limit_stops_a_run():
    task = make_task("a5", length=4)
    module = wrap_readout(build_model("gpt", d_model=16, n_layers=1, n_heads=2, vocab_size=60), task, 16)
    settings = TrainSettings(steps=10**6, batch_size=4, time_limit_s=0.5)
    stats = train(module, FreshBatches(task, 4, 0, CPU), settings, CPU)
    assert 0 < stats["steps"] < 10**6 and stats["train_time_s"] < 5 and math.isfinite(stats["final_loss"])


def test_untimed_warmup_runs_every_batch_shape():
    """The warm-up step (kernel compilation, untimed) sees the main and the auxiliary batch before step 0."""
    task = make_task("a5", length=6)
    module = wrap_readout(build_model("gpt", d_model=16, n_layers=1, n_heads=2, vocab_size=60), task, 16)
    lengths = []
    module.register_forward_pre_hook(lambda _, args: lengths.append(args[0].shape[1]))
    aux = FreshBatches(make_task("a5", length=2), 4, 1, CPU)
    train(module, FreshBatches(task, 4, 0, CPU), TrainSettings(steps=1, batch_size=4), CPU, aux_batch=aux)
    assert lengths == [6, 2, 6, 2]  # warm-up: main, aux; then step 0: main, aux


def _tiny_run(arch, task, steps, lr=3e-3, d_model=64, n_layers=2, batch=32, train_size=None, aux=None):
    torch.manual_seed(0)
    model = build_model(arch, d_model=d_model, n_layers=n_layers, n_heads=4, vocab_size=task.vocab_size)
    module = wrap_readout(model, task, d_model)
    settings = TrainSettings(steps=steps, batch_size=batch, lr=lr, warmup_frac=0.05, weight_decay=0.0)
    if train_size is None:
        source = FreshBatches(task, batch, 0, CPU)
    else:
        source = SplitBatches(*materialize(task, train_size, 0, "train"), batch, 0)
    aux_batch = None if aux is None else FreshBatches(aux, 8, 1, CPU)
    train(module, source, settings, CPU, aux_batch=aux_batch)
    return evaluate(module, *materialize(task, 256, 0, "test"), 256, CPU)


def test_a5_short_length_beats_chance():
    """Length 3 (chance 1/60 per token); the first position is a copy, the others need the group product."""
    task = make_task("a5", length=3)
    metrics = _tiny_run("gpt", task, steps=150, aux=make_task("a5", length=2))
    assert metrics["token_acc"] > 0.3, metrics


def test_mqar_tiny_beats_chance():
    """Vocabulary 64 (32 values: chance ~3 %), 2 pairs in 16 tokens."""
    task = make_task("mqar", length=16, num_pairs=2, vocab=64)
    metrics = _tiny_run("gpt", task, steps=200, train_size=4096)
    assert metrics["token_acc"] > 0.15, metrics


def test_mad_memorization_beats_chance():
    """A fixed map of 15 keys (vocab 32); chance 1/16."""
    task = make_task("mad_memorization", vocab=32, length=8)
    metrics = _tiny_run("gpt", task, steps=150, n_layers=1, train_size=512)
    assert metrics["token_acc"] > 0.3, metrics


def test_mad_compression_decoder_beats_chance():
    """The last-position decoder readout: 4 tokens over 7 symbols (chance 1/7 for the data positions)."""
    task = make_task("mad_compression", vocab=8, length=4)
    metrics = _tiny_run("gpt", task, steps=150, n_layers=1, train_size=2048)
    assert metrics["token_acc"] > 0.45, metrics  # chance: 3/4 x 1/7 + 1/4 (the fixed last token) ~ 0.36


def test_last_position_decoder_reads_the_lm_hidden_state():
    task = make_task("mad_compression", vocab=8, length=5)
    model = build_model("gpt", d_model=16, n_layers=1, n_heads=2, vocab_size=8)
    module = wrap_readout(model, task, 16)
    inputs, labels = materialize(task, 4, 0, "test")
    logits = module(inputs)
    assert logits.shape == (4, 5, 8)
    masked_cross_entropy(logits, labels).backward()
    assert model.get_input_embeddings().weight.grad.abs().sum() > 0  # gradients reach the LM
    changed = inputs.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 7
    assert not torch.allclose(module(changed), logits)  # the output depends on earlier tokens
