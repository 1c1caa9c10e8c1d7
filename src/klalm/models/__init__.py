"""klalm.models: one backbone, five architectures, Hugging Face classes and the size presets.

model = build_model("kla", preset="45m")                     # a KLALMForCausalLM
model = build_model("gpt_kla", d_model=256, n_layers=4, kla_layers=[1, 3], vocab_size=32000)
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from klalm.models.config import ARCH_LAYOUTS, KLALMConfig
from klalm.models.hf import KLALMCache, KLALMForCausalLM, KLALMOutput
from klalm.models.mixers import MIXERS
from klalm.models.mixers.base import Mixer
from klalm.models.presets import PRESETS, preset_fields
from klalm.ops.backends import prepare

_CONFIG_KEYS = tuple(
    name
    for name, p in inspect.signature(KLALMConfig.__init__).parameters.items()
    if name not in ("self", "arch") and p.kind == p.POSITIONAL_OR_KEYWORD
)


def build_model(arch: str, preset: str | None = None, **overrides: Any) -> KLALMForCausalLM:
    """Build a freshly initialised causal LM.

    Args:
        arch: "gpt", "kla", "mamba", "gdn" or "gpt_kla" (a KeyError-free ValueError lists them otherwise).
        preset: a size ("45m", "180m", "tiny"): starts from PRESETS["<arch>_<size>"]; None: config defaults.
        **overrides: any KLALMConfig field (d_model, n_layers, d_ff, n_heads, vocab_size, kla_layers,
            mixer_options, ...); a value of None keeps the preset's (or default) value, which is how the
            Hydra model configs leave a key unset; so does a None among mixer_options[name] (the mixer's
            default). vocab_size is padded to a multiple of 64.

    Returns:
        KLALMForCausalLM in float32 on the current default device.
    """
    if arch not in ARCH_LAYOUTS:
        raise ValueError(f"unknown arch {arch!r}; valid: {sorted(ARCH_LAYOUTS)}")
    unknown = sorted(set(overrides) - set(_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"build_model: unknown keys {unknown}; valid: {sorted(_CONFIG_KEYS)}")
    fields = preset_fields(arch, preset) if preset is not None else {}
    fields.update({key: value for key, value in overrides.items() if value is not None})
    if "mixer_options" in fields:
        options = {
            name: {k: v for k, v in opts.items() if v is not None} for name, opts in fields["mixer_options"].items()
        }
        fields["mixer_options"] = {name: opts for name, opts in options.items() if opts}
    return KLALMForCausalLM(KLALMConfig(arch=arch, **fields))


def prepare_backends(model: nn.Module, device: torch.device | str) -> None:
    """Make the "auto" backend choice of every mixer op in `model` for `device` now (`klalm.ops.backends.prepare`).

    Call it before torch.compile traces the model: made inside the trace, the choice's log line (and on a GPU its
    probe) would split the compiled model into several graphs for as long as it runs.
    """
    mixers = [m for m in model.modules() if isinstance(m, Mixer) and m.backend_op and m.backend == "auto"]
    for op in dict.fromkeys(m.backend_op for m in mixers):  # each op once, in the model's order
        prepare(op, torch.device(device))


# `AutoModelForCausalLM.from_pretrained(dir)` loads klalm exports once this module ran (`import klalm` sees to it).
AutoConfig.register(KLALMConfig.model_type, KLALMConfig, exist_ok=True)
AutoModelForCausalLM.register(KLALMConfig, KLALMForCausalLM, exist_ok=True)
# save_pretrained writes `auto_map` and the code of both classes into the folder, so it also loads without klalm
# imported, with trust_remote_code=True (klalm.models.export).
KLALMConfig.register_for_auto_class()
KLALMForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "ARCH_LAYOUTS",
    "MIXERS",
    "PRESETS",
    "KLALMCache",
    "KLALMConfig",
    "KLALMForCausalLM",
    "KLALMOutput",
    "build_model",
    "prepare_backends",
]
