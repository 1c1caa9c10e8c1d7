"""Progress samples through the model's own `generate()`, which decodes with its cache: after the prompt, each new
token is one O(1) step for the recurrent mixers and one KV-cache step for attention (see klalm.models.hf)."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

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
    eos_token_id: int | None = None,
    streamer: Any = None,
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
        streamer: a `transformers` streamer (`put(ids)` with the prompt [1, T0] first, then each new token [1];
            `end()`), e.g. `TextStreamer`, handed the tokens as they are generated; it gets exactly the tokens
            returned (not the one a non-finite step drew).

    A model whose logits are not finite (a diverging run, whose steps the training loop skips and counts) ends the
    sample early with a warning instead of ending the run; the decision follows the logits, so every rank of a
    sharded model takes it alike.
    """
    if temperature < 0 or top_k < 0:
        raise ValueError(f"temperature={temperature} and top_k={top_k} must be ≥ 0")
    options: dict[str, Any] = {"do_sample": False}
    guard = _NonFiniteGuard()
    processors = LogitsProcessorList([guard.processor])
    if temperature > 0:
        options = {"do_sample": True, "temperature": 1.0, "top_k": top_k, "top_p": 1.0}  # (1.0: _Temperature's)
        processors.append(_Temperature(temperature))
    devices = [prompt_ids.device] if prompt_ids.device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices), value_checks_suspended():
            torch.manual_seed(seed)
            ids = model.generate(
                prompt_ids,
                attention_mask=torch.ones_like(prompt_ids),
                max_new_tokens=max_new_tokens,
                eos_token_id=eos_token_id,
                pad_token_id=eos_token_id,
                use_cache=True,
                logits_processor=processors,
                stopping_criteria=StoppingCriteriaList([guard.stop]),
                streamer=None if streamer is None else _GuardedStreamer(streamer, guard),
                **options,
            )
    finally:
        model.train(was_training)
    if guard.hit:  # the token drawn from the neutralised scores is not part of the sample
        ids = ids[:, :-1]
        log.warning("sample stopped after %d tokens: the model's logits are not finite", ids.shape[1])
    return ids


class _NonFiniteGuard:
    """Ends generation at the first step whose logits are not finite: as a logits processor it replaces them by
    zeros (so drawing the step's token cannot fail) and remembers it; as a stopping criterion it then stops.
    `sample_ids` drops that step's token."""

    def __init__(self) -> None:
        self.hit_at: int | None = None  # the position of the token drawn from the neutralised scores
        guard = self

        class Scores(LogitsProcessor):
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
                if torch.isfinite(scores).all():
                    return scores
                if not guard.hit:
                    guard.hit_at = input_ids.shape[1]
                return torch.zeros_like(scores)

        class Stop(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
                return torch.full((input_ids.shape[0],), guard.hit, dtype=torch.bool, device=input_ids.device)

        self.processor, self.stop = Scores(), Stop()

    @property
    def hit(self) -> bool:
        """Whether a step's logits were not finite."""
        return self.hit_at is not None


class _Temperature(LogitsProcessor):
    """The temperature, in place of generate's, which fails on a tiny one: the scores less their maximum (the softmax
    is the same) over the temperature, the maximum kept at 0. A temperature so small that the scores over it overflow,
    or that is 0 in their dtype, then gives -inf for all tokens but the most likely (sampling becomes greedy, its
    limit), not inf or 0 / 0, whose NaN probabilities torch.multinomial refuses with an error."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        shifted = scores - scores.amax(dim=-1, keepdim=True)  # (finite: _NonFiniteGuard's processor comes first)
        return torch.where(shifted == 0, shifted, shifted / self.temperature)


class _GuardedStreamer:
    """Hands generate's tokens on to a streamer, less the one drawn from a non-finite step's neutralised scores
    (`_NonFiniteGuard.hit_at`) and any after it. Told apart by position, not by when they come: generate may stream a
    token one step late (its deferred stop check), after the guard has already seen the next step's logits."""

    def __init__(self, streamer: Any, guard: _NonFiniteGuard) -> None:
        self.streamer, self.guard = streamer, guard
        self.length: int | None = None  # tokens put so far; None before the prompt

    def put(self, value: torch.Tensor) -> None:
        if self.length is None:  # the prompt, [1, T0]
            self.length = value.shape[-1]
            self.streamer.put(value)
            return
        position, self.length = self.length, self.length + 1  # one new token, [1]
        if self.guard.hit_at is None or position < self.guard.hit_at:
            self.streamer.put(value)

    def end(self) -> None:
        self.streamer.end()


def sample_text(model: nn.Module, tokenizer: Any, prompt: str, **kwargs: Any) -> str:
    """Decoded continuation of `prompt` (prompt included), ending at the tokenizer's EOS at the latest; keyword
    arguments as in `sample_ids`."""
    device = next(model.parameters()).device
    prompt_ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)  # [1, T0]
    if prompt_ids.shape[1] == 0:
        raise ValueError(f"sampler prompt {prompt!r} encodes to no token")
    ids = sample_ids(model, prompt_ids, eos_token_id=tokenizer.eos_token_id, **kwargs)
    return tokenizer.decode(ids[0].tolist())
