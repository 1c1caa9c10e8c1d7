"""Held-out loss and perplexity of a causal LM on a validation stream.

Batches follow klalm.data's convention: {"input_ids": [B, T], "labels": [B, T]} with labels already shifted
(labels[b, t] is the token that should follow input_ids[b, :t + 1]) and -100 at positions not scored. The loss is
the mean negative log-likelihood in nats per scored token over the whole stream (token-weighted, not a mean of
batch means); ppl = exp(loss). Under torch.distributed the sums are all-reduced, so every rank gets the global
numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from tqdm.auto import tqdm

from klalm.loss import scored_tokens, token_cross_entropy


def _batch_nll(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> tuple[float, int]:
    """Sum of token NLLs (float64 accumulate) and the number of scored tokens of one batch."""
    for key in ("input_ids", "labels"):
        if key not in batch:
            raise KeyError(f"validation batch lacks {key!r}; it has {sorted(batch)}")
    input_ids = batch["input_ids"].to(device)
    labels = batch["labels"].to(device)
    if input_ids.shape != labels.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and labels {tuple(labels.shape)} differ in shape")
    logits = model(input_ids=input_ids).logits  # [B, T, V]
    nll = token_cross_entropy(logits, labels, reduction="sum")  # float32 at least
    return nll.double().item(), int(scored_tokens(labels).item())


@torch.no_grad()
def evaluate_loss(
    model: torch.nn.Module,
    dataloader: Iterable[dict[str, torch.Tensor]],
    *,
    max_batches: int | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Token-weighted held-out loss and perplexity.

    Args:
        model: causal LM whose `forward(input_ids=...)` returns `.logits` [B, T, V].
        dataloader: iterable of {"input_ids": LongTensor[B, T], "labels": LongTensor[B, T]} (labels pre-shifted,
            -100 = not scored).
        max_batches: stop after this many batches (None: the whole stream; a validation stream must then end).
        device: where to run; None = the device of the model's first parameter.
        progress: show a progress bar.

    Returns:
        {"loss": mean NLL in nats per token, "ppl": exp(loss), "tokens": scored tokens, "batches": batches read}.
        The model's train/eval mode is restored afterwards.

    Raises:
        KeyError / ValueError: a batch lacks a key or its tensors differ in shape.
        ValueError: no scored token at all (empty stream or all labels -100).
    """
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be positive or None, got {max_batches}")
    target = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    total_nll, total_tokens, batches = 0.0, 0, 0
    try:
        for batch in tqdm(dataloader, desc="val loss", total=max_batches, disable=not progress):
            nll, tokens = _batch_nll(model, batch, target)
            total_nll, total_tokens, batches = total_nll + nll, total_tokens + tokens, batches + 1
            if max_batches is not None and batches >= max_batches:
                break
    finally:
        model.train(was_training)
    total_nll, total_tokens = _all_reduce_sums(total_nll, total_tokens, target)
    if total_tokens == 0:
        raise ValueError("no scored tokens in the validation stream (empty, or every label is -100)")
    loss = total_nll / total_tokens
    return {"loss": loss, "ppl": math.exp(loss), "tokens": total_tokens, "batches": batches}


def _all_reduce_sums(nll: float, tokens: int, device: torch.device) -> tuple[float, int]:
    """Sum (nll, tokens) over ranks when torch.distributed is initialised; identity otherwise."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return nll, tokens
    sums = torch.tensor([nll, float(tokens)], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(sums)
    return sums[0].item(), int(sums[1].item())
