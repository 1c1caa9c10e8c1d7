"""A5 permutation composition: the state-tracking task of Merrill, Petty & Sabharwal (2024).

The group: A5 = the 60 even permutations of {0, 1, 2, 3, 4}. A permutation is a tuple `p` with `p[i]` the
image of i. Token ids are fixed: the even permutations in lexicographic order of their tuples, so token 0 is
the identity (0, 1, 2, 3, 4).

Composition order: `(p ∘ q)[i] = p[q[i]]` (apply q first). For inputs x_1 .. x_L the target at position t is
the running product with the newest permutation applied last,

    y_1 = x_1,    y_t = x_t ∘ y_{t-1} = x_t ∘ x_{t-1} ∘ ... ∘ x_1,

i.e. the permutation obtained by applying x_1, then x_2, ..., then x_t. Every position is scored.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import torch
from torch import Tensor

from klalm.tasks.base import Split, SyntheticTask

DEGREE = 5  # A5 acts on 5 points


def _parity(perm: tuple[int, ...]) -> int:
    """0 for even permutations, 1 for odd ones (parity of the inversion count)."""
    return sum(perm[i] > perm[j] for i in range(len(perm)) for j in range(i + 1, len(perm))) % 2


PERMUTATIONS: tuple[tuple[int, ...], ...] = tuple(
    perm for perm in itertools.permutations(range(DEGREE)) if _parity(perm) == 0
)
INDEX: dict[tuple[int, ...], int] = {perm: i for i, perm in enumerate(PERMUTATIONS)}
GROUP_ORDER = len(PERMUTATIONS)  # 60


def compose(p: tuple[int, ...], q: tuple[int, ...]) -> tuple[int, ...]:
    """p ∘ q: apply q first, then p."""
    return tuple(p[q[i]] for i in range(len(q)))


def _multiplication_table() -> Tensor:
    """MUL[i, j] = token of PERMUTATIONS[i] ∘ PERMUTATIONS[j]; int64 [60, 60]."""
    table = [[INDEX[compose(p, q)] for q in PERMUTATIONS] for p in PERMUTATIONS]
    return torch.tensor(table, dtype=torch.long)


MULTIPLICATION_TABLE = _multiplication_table()


def prefix_products(tokens: Tensor, table: Tensor = MULTIPLICATION_TABLE, out: Tensor | None = None) -> Tensor:
    """Running products y_t = x_t ∘ y_{t-1} of token sequences.

    Args:
        tokens: int64 [N, L], A5 tokens in [0, 60).
        table: MULTIPLICATION_TABLE on the tokens' device.
        out: int64 [N, L] to write the products into (None: a new tensor).

    Returns:
        int64 [N, L], the token of the product of each prefix (`out` when given).
    """
    products = torch.empty_like(tokens) if out is None else out
    products[:, 0] = tokens[:, 0]
    for t in range(1, tokens.shape[1]):
        products[:, t] = table[tokens[:, t], products[:, t - 1]]
    return products


@dataclasses.dataclass(frozen=True)
class A5Task(SyntheticTask):
    """Uniformly random A5 tokens; the label at every position is the product of the prefix.

    Args:
        length: sequence length L (the recipe uses 3-20; the SLiCE-style auxiliary batch uses L = 2).
    """

    length: int = 16

    def __post_init__(self):
        if self.length < 1:
            raise ValueError(f"A5 length must be >= 1, got {self.length}")

    @property
    def vocab_size(self) -> int:
        return GROUP_ORDER

    @property
    def seq_len(self) -> int:
        return self.length

    def sample(self, num_examples: int, generator: torch.Generator, split: Split = "test") -> tuple[Tensor, Tensor]:
        tokens = torch.randint(GROUP_ORDER, (num_examples, self.length), generator=generator)  # [N, L]
        return tokens, prefix_products(tokens)

    @staticmethod
    def labeler(device: torch.device | str) -> Callable[[Tensor, Tensor], Tensor]:
        """labels(tokens [N, L], out [N, L]) -> out: the prefix products, computed on `device` (for FreshStream)."""
        table = MULTIPLICATION_TABLE.to(device)
        return lambda tokens, out: prefix_products(tokens, table, out)
