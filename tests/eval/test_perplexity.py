"""Held-out loss / perplexity against a direct float64 computation."""

from __future__ import annotations

import math

import pytest
import torch

from klalm.eval import evaluate_loss
from klalm.models import build_model

VOCAB = 128


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model("gpt", preset="tiny", vocab_size=VOCAB).double()


def _batches():
    gen = torch.Generator().manual_seed(1)
    out = []
    for batch, length in ((3, 9), (1, 9), (2, 9)):  # unequal batch sizes: the mean must weight tokens, not batches
        ids = torch.randint(0, VOCAB, (batch, length + 1), generator=gen)
        labels = ids[:, 1:].clone()
        labels[0, :2] = -100  # unscored positions
        out.append({"input_ids": ids[:, :-1], "labels": labels})
    return out


def _direct(model, batches):
    nll, count = 0.0, 0
    for batch in batches:
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=batch["input_ids"]).logits.double(), dim=-1)  # [B, T, V]
        for b, t in (batch["labels"] != -100).nonzero().tolist():
            nll -= logp[b, t, batch["labels"][b, t]].item()
            count += 1
    return nll / count, count


def test_matches_direct_computation(model):
    batches = _batches()
    model.train()
    result = evaluate_loss(model, batches)
    loss, count = _direct(model, batches)
    assert result["tokens"] == count == 6 * 9 - 2 * 3 and result["batches"] == 3
    assert result["loss"] == pytest.approx(loss, rel=1e-12)
    assert result["ppl"] == pytest.approx(math.exp(loss), rel=1e-12)
    assert model.training  # mode restored


def test_max_batches(model):
    batches = _batches()
    result = evaluate_loss(model, batches, max_batches=2)
    assert result["loss"] == pytest.approx(_direct(model, batches[:2])[0], rel=1e-12) and result["batches"] == 2


def test_bad_batches(model):
    with pytest.raises(KeyError, match="labels"):
        evaluate_loss(model, [{"input_ids": torch.zeros(1, 4, dtype=torch.long)}])
    with pytest.raises(ValueError, match="differ in shape"):
        evaluate_loss(model, [{"input_ids": torch.zeros(1, 4, dtype=torch.long), "labels": torch.zeros(1, 3)}])
    with pytest.raises(ValueError, match="no scored tokens"):
        evaluate_loss(model, [{"input_ids": torch.zeros(1, 4, dtype=torch.long), "labels": torch.full((1, 4), -100)}])
