"""The one token loss: IGNORE_INDEX positions are not scored, and the log-softmax runs in float32 at least."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from klalm.loss import IGNORE_INDEX, scored_tokens, token_cross_entropy


def test_ignored_labels_are_not_scored():
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    labels = torch.randint(0, 7, (2, 5))
    labels[0, 1] = labels[1, 4] = IGNORE_INDEX
    keep = labels != IGNORE_INDEX
    expected = F.cross_entropy(logits[keep], labels[keep], reduction="sum")
    torch.testing.assert_close(token_cross_entropy(logits, labels, reduction="sum"), expected)
    torch.testing.assert_close(token_cross_entropy(logits, labels), expected / 8)
    assert scored_tokens(labels).item() == 8


@pytest.mark.parametrize(("dtype", "loss_dtype"), [(torch.bfloat16, torch.float32), (torch.float64, torch.float64)])
def test_loss_dtype(dtype, loss_dtype):
    loss = token_cross_entropy(torch.randn(1, 3, 5, dtype=dtype), torch.tensor([[0, 1, 2]]))
    assert loss.dtype == loss_dtype
