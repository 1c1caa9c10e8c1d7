"""Progress samples through the model's own `generate()`, which decodes with its cache: after the prompt, each new
token is one O(1) step for the recurrent mixers and one KV-cache step for attention (see klalm.models.hf)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


@torch.no_grad()
def sample_ids(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int = 50,
    seed: int = 0,
    eos_token_id: int | None = None,
) -> torch.Tensor:
    """Extends `prompt_ids` [1, T0] by up to `max_new_tokens` tokens with `model.generate`; returns [1, T0 + n].

    Args:
        model: a klalm causal LM (`transformers.GenerationMixin`).
        prompt_ids: [1, T0] int64 token ids on the model's device.
        max_new_tokens: tokens to generate (fewer when `eos_token_id` comes first).
        temperature: softmax temperature; 0 picks the argmax (greedy).
        top_k: sample among the k most likely tokens; 0 keeps all.
        seed: seed of the sampling; the global RNGs are saved before and restored after (`torch.random.fork_rng`).
        eos_token_id: stop after this token (also used as the padding id generate asks for); None: never stop early.
    """
    if temperature < 0 or top_k < 0:
        raise ValueError(f"temperature={temperature} and top_k={top_k} must be ≥ 0")
    options: dict[str, Any] = {"do_sample": False}
    if temperature > 0:
        options = {"do_sample": True, "temperature": temperature, "top_k": top_k, "top_p": 1.0}
    devices = [prompt_ids.device] if prompt_ids.device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return model.generate(
                prompt_ids,
                attention_mask=torch.ones_like(prompt_ids),
                max_new_tokens=max_new_tokens,
                eos_token_id=eos_token_id,
                pad_token_id=eos_token_id,
                use_cache=True,
                **options,
            )
    finally:
        model.train(was_training)


def sample_text(model: nn.Module, tokenizer: Any, prompt: str, **kwargs: Any) -> str:
    """Decoded continuation of `prompt` (prompt included), ending at the tokenizer's EOS at the latest; keyword
    arguments as in `sample_ids`."""
    device = next(model.parameters()).device
    prompt_ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)  # [1, T0]
    if prompt_ids.shape[1] == 0:
        raise ValueError(f"sampler prompt {prompt!r} encodes to no token")
    ids = sample_ids(model, prompt_ids, eos_token_id=tokenizer.eos_token_id, **kwargs)
    return tokenizer.decode(ids[0].tolist())
