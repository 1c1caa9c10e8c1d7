"""Multi-query associative recall (MQAR) as defined by Zoology (Arora et al. 2023).

Layout of one example of length L with K key-value pairs and vocabulary V:

    positions [0, 2K):   k_1 v_1 k_2 v_2 ... k_K v_K      keys distinct in [1, V/2), values distinct in [V/2, V)
    positions [2K, L):   random filler tokens from [0, V), except that key k_i is placed again at the query
                         position 2K + 2·g_i, where the gaps g_i are distinct, drawn without replacement from
                         {0, .., S-1}, S = (L - 2K)/2, with P(g) ∝ (g + 1)^(a - 1) (power law, a = 0.01)

Only query positions are scored, and the label there is the key's value (the model must output v_i when it
reads the repeated k_i). Fillers may coincide with keys by chance; they are never scored (Zoology's
`random_non_queries`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from klalm.loss import IGNORE_INDEX
from klalm.tasks.base import Split, SyntheticTask


def _distinct(num_examples: int, low: int, high: int, count: int, generator: torch.Generator) -> Tensor:
    """`count` distinct integers in [low, high) per row, uniformly: int64 [N, count]."""
    scores = torch.rand(num_examples, high - low, generator=generator)  # [N, high - low]
    return scores.topk(count, dim=1).indices + low


@dataclasses.dataclass(frozen=True)
class MQARTask(SyntheticTask):
    """Zoology MQAR.

    Args:
        length: sequence length L (even).
        num_pairs: K key-value pairs; requires 4K <= L (K pairs plus K query slots).
        vocab: V, vocabulary size (Zoology: 8192); needs V/2 - 1 >= K keys and V/2 >= K values.
        power_a: the power-law parameter a of the query gaps (Zoology: 0.01).
    """

    length: int = 64
    num_pairs: int = 4
    vocab: int = 8192
    power_a: float = 0.01

    def __post_init__(self):
        if self.length % 2:
            raise ValueError(f"MQAR length must be even, got {self.length}")
        if 4 * self.num_pairs > self.length or self.num_pairs < 1:
            raise ValueError(f"MQAR num_pairs={self.num_pairs} needs 1 <= 4 * num_pairs <= length={self.length}")
        if self.vocab // 2 - 1 < self.num_pairs:
            raise ValueError(f"MQAR vocab={self.vocab} has too few keys for num_pairs={self.num_pairs}")
        if not 0 < self.power_a <= 1:
            raise ValueError(f"MQAR power_a must be in (0, 1], got {self.power_a}")

    @property
    def scored_per_row(self) -> int:
        """Every row scores its K query positions, in both splits."""
        return self.num_pairs

    def gap_probabilities(self) -> Tensor:
        """P(g) for g in [0, S): float64 [S], ∝ (g + 1)^(a - 1)."""
        slots = (self.length - 2 * self.num_pairs) // 2
        weights = torch.arange(1, slots + 1, dtype=torch.float64) ** (self.power_a - 1)
        return weights / weights.sum()

    def sample(self, num_examples: int, generator: torch.Generator, split: Split = "test") -> tuple[Tensor, Tensor]:
        n, k, half = num_examples, self.num_pairs, self.vocab // 2
        keys = _distinct(n, 1, half, k, generator)  # [N, K]
        values = _distinct(n, half, self.vocab, k, generator)  # [N, K]
        probs = self.gap_probabilities().expand(n, -1)  # [N, S]
        gaps = torch.multinomial(probs, k, replacement=False, generator=generator)  # [N, K]
        inputs = torch.randint(self.vocab, (n, self.length), generator=generator)  # [N, L] fillers
        inputs[:, 0 : 2 * k : 2] = keys
        inputs[:, 1 : 2 * k : 2] = values
        query_positions = 2 * k + 2 * gaps  # [N, K]
        inputs.scatter_(1, query_positions, keys)
        labels = torch.full_like(inputs, IGNORE_INDEX)
        labels.scatter_(1, query_positions, values)
        return inputs, labels
