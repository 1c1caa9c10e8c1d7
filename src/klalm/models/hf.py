"""Hugging Face wrapper: `KLALMForCausalLM` (PreTrainedModel + GenerationMixin) around the one backbone.

What it adds to `klalm.models.backbone.KLALM`: the next-token loss, save/load through safetensors (the tied
LM head is declared in `_tied_weights_keys`), the uncertainty readouts, and generation with per-layer
recurrent state. Generation does not use transformers' Cache classes: the model reports that it cannot
use a DynamicCache, so `generate()` leaves the cache to it; the first forward creates a `KLALMCache` holding
each layer's own state (a KV cache for attention, conv window + filter state for the recurrent mixers) and
returns it, and every later step feeds only the new token (L = 1), which costs O(1) for recurrent mixers.
transformers renamed `past_key_values` to `cache` during the 5.x series; both names are accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from klalm.loss import token_cross_entropy
from klalm.models.backbone import KLALM
from klalm.models.config import KLALMConfig

# The output field that carries the cache in the installed transformers ("cache" from 5.2x, before that
# "past_key_values"); generate() reads the next step's cache from it.
CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


class KLALMCache:
    """Decode state of a whole model: one mixer state per layer and the number of tokens already consumed.

    Attributes:
        states: per-layer states, each the object that layer's mixer returns (e.g. a KV cache [B, H, T, E]).
        seen_tokens: tokens consumed so far (the position of the next token).
    """

    def __init__(self, states: list[Any], seen_tokens: int = 0):
        self.states, self.seen_tokens = states, seen_tokens

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens consumed so far (the name transformers' generation utilities use)."""
        return self.seen_tokens

    def __len__(self) -> int:
        return len(self.states)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Select batch rows (beam search): every state tensor is indexed by beam_idx [B'] along dim 0.

        Relies on the mixer contract's batch-first states (tensors inside tuples / NamedTuples, any nesting).
        """
        self.states = [_map_tensors(state, lambda t: t.index_select(0, beam_idx.to(t.device))) for state in self.states]


@dataclasses.dataclass
class KLALMOutput(CausalLMOutputWithPast):
    """CausalLMOutputWithPast plus the uncertainty readouts.

    variance: output variance of the last KLA mixer, [B, L, D] (with `return_variance=True` or `mc_samples > 0`).
    mc_probs: Monte-Carlo marginal next-token distribution, [B, L, V], float32 or wider (with `mc_samples > 0`).
    """

    variance: Tensor | None = None
    mc_probs: Tensor | None = None


class KLALMPreTrainedModel(PreTrainedModel):
    """Shared Hugging Face plumbing: config class, init table hook, no default DynamicCache."""

    config_class = KLALMConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _is_stateful = True  # recurrent states cannot be rolled back: no assisted decoding

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Initialise through the backbone's INIT_RULES (Hugging Face calls this for every submodule)."""
        if isinstance(module, KLALM):
            module.reset_parameters()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # our forward creates and returns its own KLALMCache


class KLALMForCausalLM(KLALMPreTrainedModel, GenerationMixin):
    """Causal LM for every klalm arch: forward(input_ids) -> KLALMOutput with .logits [B, L, V].

    Args:
        config: the model's KLALMConfig.
    """

    _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}

    def __init__(self, config: KLALMConfig):
        super().__init__(config)
        self.model = KLALM(config)
        self.post_init()

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.model.lm_head

    def set_output_embeddings(self, value: torch.nn.Linear) -> None:
        self.model.lm_head = value

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        past_key_values: KLALMCache | None = None,
        cache: KLALMCache | None = None,
        use_cache: bool | None = None,
        return_variance: bool = False,
        mc_samples: int = 0,
        logits_to_keep: int = 0,
        return_dict: bool | None = None,
    ) -> KLALMOutput | tuple:
        """Logits (and loss, cache, uncertainty readouts) for input_ids.

        Args:
            input_ids: token ids, [B, L]; with a cache, only the tokens after those it has seen.
            attention_mask: [B, T] of ones, accepted for generate(); padding (zeros) is not supported.
            labels: [B, L] targets aligned with input_ids (usually input_ids itself); the loss is the mean
                next-token cross-entropy of logits[:, :-1] against labels[:, 1:], ignoring IGNORE_INDEX (-100).
            past_key_values, cache: a KLALMCache to continue from (two names for one argument).
            use_cache: return a KLALMCache after these tokens (default: config.use_cache when not training).
            return_variance: also return the last KLA layer's output variance (`variance`, [B, L, D]).
            mc_samples: n > 0 also returns the Monte-Carlo marginal `mc_probs` [B, L, V]
                (see KLALM.forward_uncertain for exactly what is sampled).
            logits_to_keep: n > 0 computes the logits of the last n positions only (generate() passes 1);
                0 computes all. Not combinable with labels.
            return_dict: False returns a tuple (loss?, logits, ...), as transformers models do.

        Returns:
            KLALMOutput with logits [B, L, V] (float in the model dtype), loss (scalar, float32 or wider) when labels
            are given, the cache when use_cache, and variance / mc_probs when asked for.
        """
        cache = _one_cache(cache, past_key_values)
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError(
                "attention_mask has zeros: padded batches are not supported (the mixers are causal "
                "recurrences); use equal-length sequences or batch size 1"
            )
        variance = mc_probs = new_cache = None
        if return_variance or mc_samples:
            if cache is not None:
                raise ValueError("return_variance / mc_samples run on a fresh sequence; got a cache")
            hidden, variance, mc_probs = self.model.forward_uncertain(input_ids, mc_samples)
        else:
            hidden, new_cache = self._run(input_ids, cache, use_cache)
        if logits_to_keep:
            if labels is not None:
                raise ValueError("logits_to_keep > 0 drops positions the loss needs; pass labels without it")
            hidden = hidden[:, -logits_to_keep:]  # [B, n, D]
        logits = self.model.lm_head(hidden)  # [B, L, V] (or [B, n, V])
        loss = None if labels is None else next_token_loss(logits, labels)
        out = KLALMOutput(loss=loss, logits=logits, variance=variance, mc_probs=mc_probs, **{CACHE_FIELD: new_cache})
        return out if return_dict is not False else out.to_tuple()

    def _run(self, input_ids: Tensor, cache: KLALMCache | None, use_cache: bool | None) -> tuple[Tensor, Any]:
        """The stack with decode state: (final-normed hidden [B, L, D], updated KLALMCache or None)."""
        if use_cache is None:
            use_cache = self.config.use_cache and not self.training
        hidden, states = self.model(input_ids, None if cache is None else cache.states)
        if cache is None and not use_cache:
            return hidden, None
        cache = cache if cache is not None else KLALMCache(states)
        cache.states, cache.seen_tokens = states, cache.seen_tokens + input_ids.shape[1]
        return hidden, cache

    def prepare_inputs_for_generation(
        self,
        input_ids: Tensor,
        past_key_values: KLALMCache | None = None,
        cache: KLALMCache | None = None,
        attention_mask: Tensor | None = None,
        use_cache: bool = True,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """generate() hands the whole sequence so far; feed only the tokens the cache has not seen.

        Other generate() bookkeeping in kwargs (positions, first-iteration flags) is not used by this model.
        """
        cache = _one_cache(cache, past_key_values)
        if cache is not None:
            input_ids = input_ids[:, cache.seen_tokens :]  # [B, new]
        return {
            "input_ids": input_ids,
            "cache": cache,
            "use_cache": use_cache,
            "attention_mask": attention_mask,
            "logits_to_keep": logits_to_keep,
        }


def next_token_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of logits[:, t] against labels[:, t+1] (float32 or wider), ignoring IGNORE_INDEX labels.

    Args:
        logits: [B, L, V].
        labels: [B, L] token ids aligned with the inputs.
    """
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"labels shape {tuple(labels.shape)} does not match input_ids shape {tuple(logits.shape[:2])}")
    return token_cross_entropy(logits[:, :-1], labels[:, 1:])  # [B, L-1, V] against [B, L-1]


def _map_tensors(obj: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """Apply fn to every tensor in a nest of tuples / NamedTuples / lists; other leaves are returned unchanged."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        items = [_map_tensors(item, fn) for item in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [_map_tensors(item, fn) for item in obj]
    return obj


def _one_cache(cache: KLALMCache | None, past_key_values: KLALMCache | None) -> KLALMCache | None:
    """Merge the two names of the cache argument; anything but a KLALMCache (or None) is an error."""
    if cache is not None and past_key_values is not None:
        raise ValueError("pass the decode state as `cache` or `past_key_values`, not both")
    cache = cache if cache is not None else past_key_values
    if cache is not None and not isinstance(cache, KLALMCache):
        raise ValueError(f"cache must be a KLALMCache (returned by a previous forward), got {type(cache).__name__}")
    return cache


__all__ = ["CACHE_FIELD", "KLALMCache", "KLALMForCausalLM", "KLALMOutput", "KLALMPreTrainedModel"]
