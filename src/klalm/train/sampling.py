"""Plain autoregressive sampling for progress samples: one full forward per new token, no cache.

Works for any model whose `forward(input_ids).logits` is [B, T, V]; O(T²) in the sample length, which is fine for
the few dozen tokens of a progress sample and keeps this independent of each architecture's decode path.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from klalm.ops.checks import value_checks_suspended

log = logging.getLogger(__name__)


@torch.no_grad()
def sample_ids(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int = 50,
    seed: int = 0,
) -> torch.Tensor:
    """Extends `prompt_ids` [1, T0] by `max_new_tokens` sampled tokens; returns [1, T0 + max_new_tokens].

    Args:
        model: causal LM, `forward(input_ids).logits` [B, T, V].
        prompt_ids: [1, T0] int64 token ids on the model's device.
        max_new_tokens: tokens to generate.
        temperature: softmax temperature; 0 picks the argmax (greedy).
        top_k: restrict sampling to the k most likely tokens; 0 keeps all.
        seed: seed of a private generator (the global RNGs are left untouched).

    A model whose logits are not finite (a diverging run, whose steps the training loop skips and counts) ends the
    sample early with a warning instead of ending the run; the decision follows the logits, so every rank of a
    sharded model takes it alike.
    """
    if temperature < 0 or top_k < 0:
        raise ValueError(f"temperature={temperature} and top_k={top_k} must be ≥ 0")
    generator = torch.Generator(device=prompt_ids.device).manual_seed(seed)
    was_training = model.training
    model.eval()
    ids = prompt_ids
    for _ in range(max_new_tokens):
        with value_checks_suspended():
            logits = model(ids).logits[:, -1, :].float()  # [1, V]
        if not torch.isfinite(logits).all():
            log.warning("sample stopped after %d tokens: the model's logits are not finite", ids.shape[1])
            break
        if temperature == 0:
            next_id = logits.argmax(-1, keepdim=True)  # [1, 1]
        else:
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]  # [1, 1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits / temperature, dim=-1)
            next_id = torch.multinomial(probs, 1, generator=generator)  # [1, 1]
        ids = torch.cat([ids, next_id], dim=1)
    model.train(was_training)
    return ids


def sample_text(model: nn.Module, tokenizer: Any, prompt: str, **kwargs: Any) -> str:
    """Decoded continuation of `prompt` (prompt included); keyword arguments as in `sample_ids`."""
    device = next(model.parameters()).device
    prompt_ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)  # [1, T0]
    if prompt_ids.shape[1] == 0:
        raise ValueError(f"sampler prompt {prompt!r} encodes to no token")
    return tokenizer.decode(sample_ids(model, prompt_ids, **kwargs)[0].tolist())
