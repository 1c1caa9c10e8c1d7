"""Token budget → optimiser steps and gradient accumulation.

A run is specified in tokens, not steps: `global_batch_tokens` is what one optimiser step consumes across every
rank and micro-batch, `max_tokens` the total to train on. Everything else is derived here, once:

    tokens_per_micro = micro_batch_size · seq_len                   (one forward on one rank)
    accumulate       = global_batch_tokens / (tokens_per_micro · world_size)   (must divide exactly)
    max_steps        = max_tokens // global_batch_tokens

A resumed run counts from what its checkpoint has done: max_steps = steps_done + (max_tokens − tokens_seen) //
global_batch_tokens, the same number while the global batch stays, and the right one when a resume with
`resume_allow_changes=true` changes the global batch or the token budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from klalm.config_checks import ConfigError, check_takes_a_step


@dataclass(frozen=True)
class TokenBudget:
    """Derived step counts of a run.

    Attributes:
        micro_batch_size: sequences per forward pass on one rank.
        seq_len: tokens per sequence (T).
        world_size: number of data-parallel ranks.
        accumulate: micro-batches per optimiser step on each rank.
        max_steps: optimiser steps in the run.
    """

    micro_batch_size: int
    seq_len: int
    world_size: int
    accumulate: int
    max_steps: int

    @property
    def tokens_per_micro(self) -> int:
        """Tokens in one micro-batch on one rank."""
        return self.micro_batch_size * self.seq_len

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimiser step over all ranks (= the global batch)."""
        return self.tokens_per_micro * self.accumulate * self.world_size


def derive_budget(
    *,
    max_tokens: int,
    global_batch_tokens: int,
    micro_batch_size: int,
    seq_len: int,
    world_size: int,
    steps_done: int = 0,
    tokens_seen: int = 0,
) -> TokenBudget:
    """Derives gradient accumulation and the step count from a token budget.

    Args:
        max_tokens: total training tokens; the run stops after `max_tokens // global_batch_tokens` steps.
        global_batch_tokens: tokens per optimiser step over all ranks.
        micro_batch_size: sequences per forward pass on one rank.
        seq_len: tokens per sequence.
        world_size: data-parallel ranks (devices × nodes).
        steps_done, tokens_seen: what the checkpoint a run resumes from has trained (0 for a fresh run).

    Returns:
        The derived `TokenBudget`.

    Raises:
        ConfigError (a ValueError): naming the config key (`train.global_batch_tokens`, `train.max_tokens`, ...)
            when a value is not positive or the global batch is not a whole number of micro-batches on every rank.
    """
    values = {
        "train.max_tokens": max_tokens,
        "train.global_batch_tokens": global_batch_tokens,
        "data.batch_size": micro_batch_size,
        "data.seq_len": seq_len,
        "world_size": world_size,
    }
    for key, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    per_round = micro_batch_size * seq_len * world_size  # tokens of one micro-batch on every rank at once
    if global_batch_tokens % per_round:
        raise ConfigError(
            f"train.global_batch_tokens={global_batch_tokens} is not a multiple of data.batch_size × data.seq_len × "
            f"world_size = {micro_batch_size} × {seq_len} × {world_size} = {per_round}"
        )
    check_takes_a_step(max_tokens, global_batch_tokens)
    return TokenBudget(
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        world_size=world_size,
        accumulate=global_batch_tokens // per_round,
        max_steps=steps_done + max(0, max_tokens - tokens_seen) // global_batch_tokens,
    )
