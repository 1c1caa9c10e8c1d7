"""The token loss every klalm trainer and evaluator uses: cross-entropy that skips `IGNORE_INDEX` labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100  # a label that is not scored (torch's cross_entropy default)


def token_cross_entropy(logits: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy of logits[b, t] against labels[b, t] over the positions whose label is not IGNORE_INDEX.

    The log-softmax runs in float32 at least (bf16/fp16 logits would lose ~3 significant digits over V); float64
    logits stay float64.

    Args:
        logits: [B, T, V], any float dtype.
        labels: [B, T] token ids, aligned with the logits (already shifted); IGNORE_INDEX where not scored.
        reduction: "mean" (nats per scored token) or "sum".

    Returns:
        a scalar in float32 (float64 for float64 logits).
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    flat = logits.reshape(-1, logits.shape[-1]).to(dtype)  # [B·T, V]
    return F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction)  # labels [B·T]


def scored_tokens(labels: Tensor) -> Tensor:
    """The number of labels that are not IGNORE_INDEX, as a scalar tensor."""
    return (labels != IGNORE_INDEX).sum()
