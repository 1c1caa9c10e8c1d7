"""Sequence mixers and their registry `MIXERS` (name -> class); see base.py for the contract they all meet."""

from __future__ import annotations

from klalm.models.mixers.attention import Attention
from klalm.models.mixers.base import Mixer
from klalm.models.mixers.gdn import GatedDeltaNetMixer
from klalm.models.mixers.kla import KLAMixer
from klalm.models.mixers.mamba import MambaMixer

MIXERS: dict[str, type[Mixer]] = {
    "attention": Attention,
    "kla": KLAMixer,
    "mamba": MambaMixer,
    "gdn": GatedDeltaNetMixer,
}


def lookup(name: str) -> type[Mixer]:
    """The mixer class registered as `name`; a KeyError lists the valid names."""
    if name not in MIXERS:
        raise KeyError(f"unknown mixer {name!r}; valid: {sorted(MIXERS)}")
    return MIXERS[name]


__all__ = ["MIXERS", "Attention", "GatedDeltaNetMixer", "KLAMixer", "MambaMixer", "Mixer", "lookup"]
