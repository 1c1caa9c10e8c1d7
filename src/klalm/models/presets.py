"""Model presets: one row per "<arch>_<size>" (`klalm.models.params` prints their exact parameter counts).

How the sizes were chosen (docs/models.md has the table with the exact counts):
- Every count includes the embedding (tied with the LM head, so counted once) with the GPT-2 BPE vocabulary
  50257 padded to 50304; a 45m/180m preset must land within ±5 % of 45,000,000 / 180,000,000.
- Width and depth are the same for every architecture of a size: 45m is D = 512, N = 6 (the embedding alone
  is 25.8M of it); 180m is D = 1024, N = 10. Attention uses 64-wide heads (8 and 16 heads).
- The mixers differ in size (attention 4·D², KLA mamba-block ≈ 6.7-6.8·D², Mamba ≈ 6.4·D², GDN ≈ 6.0·D²), so the
  SwiGLU hidden width d_ff (a multiple of 64) absorbs the difference: it is the multiple of 64 that brings
  the arch closest to its budget. gpt's d_ff stays close to the usual 8/3·D.
- gpt_kla replaces the last attention layer of gpt by a KLA layer and keeps gpt's d_ff (it is within budget).
- "tiny" rows are for tests and smoke runs: D = 64, N = 2, d_ff = 128, 4 heads.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Preset(NamedTuple):
    """One row of the size table. budget: target parameter count (None for tiny rows: no budget)."""

    arch: str
    d_model: int
    n_layers: int
    d_ff: int
    n_heads: int
    budget: int | None


BUDGET_TOLERANCE = 0.05  # a sized preset lands within ±5 % of its budget
PRESET_VOCAB_SIZE = 50257  # GPT-2 BPE, padded to 50304 by the config; the budgets count it

_45M, _180M = 45_000_000, 180_000_000

PRESETS: dict[str, Preset] = {
    #                         arch       D     N   d_ff  heads budget
    "gpt_45m": Preset("gpt", 512, 6, 1408, 8, _45M),
    "kla_45m": Preset("kla", 512, 6, 896, 8, _45M),
    "mamba_45m": Preset("mamba", 512, 6, 960, 8, _45M),
    "gdn_45m": Preset("gdn", 512, 6, 1024, 8, _45M),
    "gpt_kla_45m": Preset("gpt_kla", 512, 6, 1408, 8, _45M),
    "gpt_180m": Preset("gpt", 1024, 10, 2816, 16, _180M),
    "kla_180m": Preset("kla", 1024, 10, 1920, 16, _180M),
    "mamba_180m": Preset("mamba", 1024, 10, 1984, 16, _180M),
    "gdn_180m": Preset("gdn", 1024, 10, 2112, 16, _180M),
    "gpt_kla_180m": Preset("gpt_kla", 1024, 10, 2816, 16, _180M),
    "gpt_tiny": Preset("gpt", 64, 2, 128, 4, None),
    "kla_tiny": Preset("kla", 64, 2, 128, 4, None),
    "mamba_tiny": Preset("mamba", 64, 2, 128, 4, None),
    "gdn_tiny": Preset("gdn", 64, 2, 128, 4, None),
    "gpt_kla_tiny": Preset("gpt_kla", 64, 2, 128, 4, None),
}


def preset_fields(arch: str, size: str) -> dict[str, Any]:
    """Config fields of preset "<arch>_<size>" (a KeyError lists the valid sizes for arch and all preset names)."""
    name = f"{arch}_{size}"
    if name not in PRESETS:
        sizes = sorted(key[len(arch) + 1 :] for key, row in PRESETS.items() if row.arch == arch)
        raise KeyError(
            f"unknown preset {name!r} (arch {arch!r}, size {size!r}); sizes for {arch!r}: {sizes}; "
            f"all presets: {sorted(PRESETS)}"
        )
    row = PRESETS[name]
    return {"d_model": row.d_model, "n_layers": row.n_layers, "d_ff": row.d_ff, "n_heads": row.n_heads}
