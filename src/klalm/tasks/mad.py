"""The six MAD-Lab tasks (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures").

Defaults are MAD's benchmark baselines (its per-task configs): recall tasks use MAD's multi-query mode, and
the dataset sizes are 12,800 train / 1,280 test examples (memorization: 256 train, as in MAD's config).
Token layouts (V = vocabulary; "scored" = label is not -100 in the test split):

- in-context recall (V 16, 128 tokens): keys [0, 8), values [8, 16), a random key -> value map per sequence;
  63 (key, value) pairs with uniform keys, then a probe pair whose key is one already shown. Every value
  whose key appeared earlier is scored (label at the key's position = the value), the probe always.
- noisy recall (V 32 incl. 16 noise tokens [16, 32), 128 tokens, noise 0.2): as above, but each of the 63
  pairs is replaced by two uniform noise tokens with probability 0.2 (one random pair is always kept).
- fuzzy recall (V 16, 128 tokens): keys are 1-3 distinct tokens from [0, 7), values 1-3 distinct tokens from
  [7, 15), token 15 pads on the left; test-split keys are always 3 tokens long. Every value token whose key
  (as a tuple) appeared earlier is scored, as is the final probe's value.
- selective copy (V 16, 256 tokens, copy 16): 16 data tokens from [0, 14) scattered among 223 blanks (14),
  then the copy token (15), then 16 blanks at whose positions the data tokens must be output in order.
- compression (V 16, 32 tokens): 31 uniform tokens from [0, 15) and the compression token 15; the whole
  sequence must be rebuilt by a decoder from the last position's hidden state (readout "last_position").
- memorization (V 256, 32 tokens): a fixed key -> value map (keys [0, 127), values [127, 255), drawn once
  from `kv_seed`) shared by all sequences; 16 (key, insert-token 255) pairs; the label at the insert token is
  the key's value, so the map must live in the weights.

Training targets: for the three recall tasks MAD trains on every next token (split "train" labels are the
shifted inputs everywhere) and scores only the recall positions (split "test"); the other tasks use the
same labels in both splits. The recall tasks are next-token tasks: a sequence of S tokens gives input_ids
[S - 1] (MAD's shift); fuzzy recall is padded to S + 1 tokens first, so its inputs have exactly S tokens.
See docs/synthetic.md for what MAD specifies and what klalm chose.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from klalm.loss import IGNORE_INDEX
from klalm.tasks.base import Split, SyntheticTask

MAD_NUM_TRAIN = 12_800
MAD_NUM_TEST = 1_280


def _next_token_labels(tokens: Tensor, scored: Tensor, split: Split) -> tuple[Tensor, Tensor]:
    """Shift a token sequence into (input_ids [N, S-1], labels [N, S-1]).

    Args:
        tokens: int64 [N, S], the whole sequence.
        scored: bool [N, S], which tokens are recall targets.
        split: "train" labels every next token (MAD's training objective), "test" only the scored ones.
    """
    targets = tokens[:, 1:]  # [N, S-1]
    if split == "test":
        targets = torch.where(scored[:, 1:], targets, IGNORE_INDEX)
    return tokens[:, :-1], targets


@dataclasses.dataclass(frozen=True)
class InContextRecallTask(SyntheticTask):
    """MAD in-context recall, multi-query (also the base of noisy recall).

    Args:
        vocab: V, all tokens including the noise tokens.
        length: S, tokens per sequence (even); input_ids have S - 1.
        noise_vocab: number of noise tokens (the top of the vocabulary).
        frac_noise: probability that a pair is replaced by two noise tokens.
    """

    num_train: ClassVar[int] = MAD_NUM_TRAIN
    num_test: ClassVar[int] = MAD_NUM_TEST
    vocab: int = 16
    length: int = 128
    noise_vocab: int = 0
    frac_noise: float = 0.0

    def __post_init__(self):
        if self.length % 2 or self.length < 4:
            raise ValueError(f"recall length must be even and >= 4, got {self.length}")
        if not 0 <= self.frac_noise < 1 or (self.frac_noise > 0 and self.noise_vocab <= 0):
            raise ValueError(f"frac_noise={self.frac_noise} must be in [0, 1) and needs noise_vocab > 0")
        if self.vocab - self.noise_vocab < 2:
            raise ValueError(f"vocab={self.vocab} leaves no keys/values next to noise_vocab={self.noise_vocab}")

    @property
    def vocab_size(self) -> int:
        return self.vocab

    @property
    def seq_len(self) -> int:
        return self.length - 1

    def sample(self, num_examples: int, generator: torch.Generator, split: Split = "test") -> tuple[Tensor, Tensor]:
        n, pairs = num_examples, self.length // 2 - 1  # P context pairs, then one probe pair
        content = self.vocab - self.noise_vocab
        num_keys = content // 2
        keys = torch.randint(num_keys, (n, pairs), generator=generator)  # [N, P]
        kv_map = torch.randint(num_keys, content, (n, num_keys), generator=generator)  # [N, keys] -> value
        values = kv_map.gather(1, keys)  # [N, P]
        noise = torch.rand(n, pairs, generator=generator) < self.frac_noise  # [N, P]
        noise.scatter_(1, torch.randint(pairs, (n, 1), generator=generator), False)  # keep >= 1 real pair
        shown = F.one_hot(keys, num_keys) * (~noise)[..., None]  # [N, P, keys]
        seen_before = (shown.cumsum(1) - shown).gather(2, keys[..., None]).squeeze(-1) > 0  # [N, P]
        probe = torch.multinomial((shown.sum(1) > 0).double(), 1, generator=generator)  # [N, 1], a shown key
        pair_tokens = torch.stack([keys, values], dim=-1)  # [N, P, 2]
        if self.frac_noise > 0:
            noise_tokens = torch.randint(content, self.vocab, (n, pairs, 2), generator=generator)
            pair_tokens = torch.where(noise[..., None], noise_tokens, pair_tokens)
        tokens = torch.cat([pair_tokens.reshape(n, 2 * pairs), probe, kv_map.gather(1, probe)], dim=1)  # [N, S]
        scored = torch.zeros_like(tokens, dtype=torch.bool)
        scored[:, 1 : 2 * pairs : 2] = seen_before & ~noise
        scored[:, -1] = True
        return _next_token_labels(tokens, scored, split)


@dataclasses.dataclass(frozen=True)
class NoisyRecallTask(InContextRecallTask):
    """MAD noisy in-context recall: in-context recall with 16 noise tokens and 20 % noise pairs."""

    vocab: int = 32
    noise_vocab: int = 16
    frac_noise: float = 0.2


@dataclasses.dataclass(frozen=True)
class FuzzyRecallTask(SyntheticTask):
    """MAD fuzzy in-context recall, multi-query: keys and values are motifs of 1..max tokens.

    Args:
        vocab: V; token V - 1 pads, keys come from [0, (V-1)//2), values from [(V-1)//2, V - 1).
        length: S, input_ids length (sequences are left-padded to S + 1 tokens, then shifted).
        max_key: longest key motif (test keys always have this length).
        max_value: longest value motif.
    """

    num_train: ClassVar[int] = MAD_NUM_TRAIN
    num_test: ClassVar[int] = MAD_NUM_TEST
    vocab: int = 16
    length: int = 128
    max_key: int = 3
    max_value: int = 3

    def __post_init__(self):
        content = self.vocab - 1
        if (
            self.max_key > content // 2
            or self.max_value > content - content // 2
            or min(self.max_key, self.max_value) < 1
        ):
            raise ValueError(
                f"fuzzy recall motifs (max_key={self.max_key}, max_value={self.max_value}) "
                f"need 1 <= motif <= vocabulary half of vocab={self.vocab}"
            )
        if self.length < 4 * (self.max_key + self.max_value):
            raise ValueError(f"fuzzy recall length={self.length} is too short for motifs of this size")

    def sample(self, num_examples: int, generator: torch.Generator, split: Split = "test") -> tuple[Tensor, Tensor]:
        rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=generator)))
        tokens = torch.full((num_examples, self.length + 1), self.vocab - 1, dtype=torch.long)  # [N, S+1] pad
        scored = torch.zeros_like(tokens, dtype=torch.bool)
        for row in range(num_examples):
            seq, flags, shown = [], [], set()
            for key, value in self.pairs(rng, split):
                seq += [*key, *value]
                flags += [False] * len(key) + [key in shown] * len(value)  # a value is scored once its key was shown
                shown.add(key)
            tokens[row, -len(seq) :] = torch.tensor(seq)
            scored[row, -len(seq) :] = torch.tensor(flags)
        return _next_token_labels(tokens, scored, split)

    def pairs(self, rng: np.random.Generator, split: Split) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """The (key motif, value motif) pairs of one sequence, the last being the probe (a key shown before).

        At most S + 1 tokens in total; keys map to one value motif per sequence.
        """
        content = self.vocab - 1
        key_vocab, value_vocab = np.arange(content // 2), np.arange(content // 2, content)
        key_sizes = np.arange(1, self.max_key + 1) if split == "train" else np.array([self.max_key])
        value_sizes = np.arange(1, self.max_value + 1)
        motif = lambda vocab, sizes: tuple(int(x) for x in rng.choice(vocab, rng.choice(sizes), replace=False))
        probe_key, probe_value = motif(key_vocab, key_sizes), motif(value_vocab, value_sizes)
        # Context pairs are added while fewer than `stop` tokens are used, and until the probe pair is in; with the
        # final probe pair the sequence then has at most S + 1 tokens.
        stop = self.length + 1 - 2 * (len(probe_key) + len(probe_value)) - self.max_key - self.max_value
        probe_at = rng.integers(stop)  # where the probe pair enters the context
        kv_map = {probe_key: probe_value}
        pairs: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        shown: set[tuple[int, ...]] = set()
        used = 0  # tokens so far
        while used < stop or probe_key not in shown:
            key = probe_key if used >= probe_at and probe_key not in shown else motif(key_vocab, key_sizes)
            value = kv_map.setdefault(key, motif(value_vocab, value_sizes))
            pairs.append((key, value))
            shown.add(key)
            used += len(key) + len(value)
        return pairs + [(probe_key, probe_value)]


@dataclasses.dataclass(frozen=True)
class SelectiveCopyTask(SyntheticTask):
    """MAD selective copying.

    Args:
        vocab: V; data tokens [0, V-2), blank V-2, copy token V-1.
        length: L, tokens per sequence; needs L > 2 * num_copy + 1.
        num_copy: C, data tokens to copy.
    """

    num_train: ClassVar[int] = MAD_NUM_TRAIN
    num_test: ClassVar[int] = MAD_NUM_TEST
    vocab: int = 16
    length: int = 256
    num_copy: int = 16

    def __post_init__(self):
        if self.length <= 2 * self.num_copy + 1 or self.num_copy < 1 or self.vocab < 3:
            raise ValueError(
                f"selective copy needs length={self.length} > 2 * num_copy={self.num_copy} + 1, vocab >= 3"
            )

    def sample(self, num_examples: int, generator: torch.Generator, split: Split = "test") -> tuple[Tensor, Tensor]:
        n, c = num_examples, self.num_copy
        blank, copy = self.vocab - 2, self.vocab - 1
        num_blank = self.length - 2 * c - 1
        data = torch.randint(blank, (n, c), generator=generator)  # [N, C]
        # Each blank independently lands before one of the C data tokens (MAD's np.insert at uniform indices).
        slots = torch.randint(c, (n, num_blank), generator=generator)  # [N, blanks]
        blanks_before = F.one_hot(slots, c).sum(1).cumsum(1)  # [N, C], blanks before data token i (inclusive)
        positions = torch.arange(c) + blanks_before  # [N, C]
        inputs = torch.full((n, self.length), blank, dtype=torch.long)  # [N, L]
        inputs.scatter_(1, positions, data)
        inputs[:, self.length - c - 1] = copy
        labels = torch.full_like(inputs, IGNORE_INDEX)
        labels[:, self.length - c :] = data
        return inputs, labels


@dataclasses.dataclass(frozen=True)
class CompressionTask(SyntheticTask):
    """MAD compression: rebuild the whole sequence from the hidden state at its last position.

    Args:
        vocab: V; data tokens [0, V-1), compression token V-1 (the last input).
        length: L, tokens per sequence.
    """

    readout: ClassVar[str] = "last_position"
    num_train: ClassVar[int] = MAD_NUM_TRAIN
    num_test: ClassVar[int] = MAD_NUM_TEST
    vocab: int = 16
    length: int = 32

    def __post_init__(self):
        if self.length < 2 or self.vocab < 2:
            raise ValueError(f"compression needs length >= 2 and vocab >= 2, got {self.length}, {self.vocab}")

    def sample(self, num_examples: int, generator: torch.Generator, split: Split = "test") -> tuple[Tensor, Tensor]:
        inputs = torch.randint(self.vocab - 1, (num_examples, self.length), generator=generator)  # [N, L]
        inputs[:, -1] = self.vocab - 1
        return inputs, inputs.clone()


@dataclasses.dataclass(frozen=True)
class MemorizationTask(SyntheticTask):
    """MAD memorization: a fixed key -> value map that the model must store in its weights.

    Args:
        vocab: V; keys [0, (V-1)//2), values [(V-1)//2, V-1), insert token V-1.
        length: L, tokens per sequence (even): L/2 (key, insert) pairs.
        kv_seed: seed of the fixed map (shared by every split and data seed).
    """

    num_train: ClassVar[int] = 256
    num_test: ClassVar[int] = MAD_NUM_TEST
    vocab: int = 256
    length: int = 32
    kv_seed: int = 12345

    def __post_init__(self):
        if self.length % 2 or self.vocab < 3:
            raise ValueError(f"memorization needs an even length and vocab >= 3, got {self.length}, {self.vocab}")

    def value_map(self) -> Tensor:
        """The fixed map: int64 [num_keys], value token of each key (a random injection into the values)."""
        content = self.vocab - 1
        num_keys = content // 2
        order = torch.randperm(content - num_keys, generator=torch.Generator().manual_seed(self.kv_seed))
        return order[:num_keys] + num_keys

    def sample(self, num_examples: int, generator: torch.Generator, split: Split = "test") -> tuple[Tensor, Tensor]:
        value_of = self.value_map()
        keys = torch.randint(value_of.numel(), (num_examples, self.length // 2), generator=generator)  # [N, L/2]
        inputs = torch.full((num_examples, self.length), self.vocab - 1, dtype=torch.long)  # [N, L] insert tokens
        inputs[:, 0::2] = keys
        labels = torch.full_like(inputs, IGNORE_INDEX)
        labels[:, 1::2] = value_of[keys]
        return inputs, labels
