"""A parameter's name as the model defines it, without the prefixes that wrappers insert.

torch.compile (`_orig_mod.`), activation checkpointing (`_checkpoint_wrapped_module.`) and FSDP
(`_fsdp_wrapped_module.`) each add a segment to `named_parameters()`; the optimiser's groups and a checkpoint's
weights are keyed by the clean name, so they match whichever wrappers a run used.

    clean_name("model._orig_mod.layers.0.mixer.q_proj.weight")  # "model.layers.0.mixer.q_proj.weight"
"""

from __future__ import annotations

WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def clean_name(name: str) -> str:
    """A parameter name with wrapper prefixes removed (stable across compile/checkpointing/FSDP)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name
