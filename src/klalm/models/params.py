"""`klalm-params`: the exact parameter count of each model preset, built on the meta device (no memory)."""

from __future__ import annotations

import torch

from klalm.models import build_model
from klalm.models.config import pad_vocab
from klalm.models.presets import PRESET_VOCAB_SIZE, PRESETS


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameter elements (a tied LM head counts once)."""
    return sum(p.numel() for p in model.parameters())


def preset_parameter_count(name: str, vocab_size: int = PRESET_VOCAB_SIZE) -> int:
    """Exact parameter count of preset `name` for a vocabulary, built on the meta device (no memory)."""
    row = PRESETS[name]
    size = name[len(row.arch) + 1 :]
    with torch.device("meta"):
        model = build_model(row.arch, preset=size, vocab_size=vocab_size)
    return count_parameters(model)


def print_table(names: list[str] | None = None, vocab_size: int | None = None) -> None:
    """`klalm-params`: a header line, then `<preset> <exact parameter count>` per preset, e.g. `gpt_45m 45,029,888`.

    Args:
        names: presets to count, each once in the order it first appears (None: all of PRESETS, in table order).
        vocab_size: tokenizer vocabulary; None: PRESET_VOCAB_SIZE, the one the budgets assume.

    Raises:
        KeyError: an unknown preset name (the message lists the valid ones).
    """
    vocab_size = PRESET_VOCAB_SIZE if vocab_size is None else vocab_size
    unknown = sorted(set(names or ()) - set(PRESETS))
    if unknown:
        raise KeyError(f"unknown preset(s) {unknown}; valid: {sorted(PRESETS)}")
    print(f"# preset parameters (vocabulary {vocab_size:,} padded to {pad_vocab(vocab_size):,}; tied embedding once)")
    for name in dict.fromkeys(names or PRESETS):
        print(f"{name} {preset_parameter_count(name, vocab_size):,}")
