"""The contract every sequence mixer meets; the backbone knows nothing else about a mixer.

A mixer maps x [B, L, D] to y [B, L, D] and carries whatever it needs to continue a sequence as an
opaque state object (a KV cache for attention; conv window + filter state for the recurrent mixers):

    y, state = mixer(x)              # fresh sequence; state is the state after the last token
    y, state = mixer(x, state)       # continue from a state (prefill or one-token decode, L = 1)
    state = mixer.init_state(batch_size, device, dtype)   # an empty state for step-by-step decode

Decoding a sequence token by token from `init_state` must reproduce the full forward pass. For the
recurrent mixers a one-token call costs O(1) in the sequence length.

States are batch-first: a tuple or NamedTuple of tensors whose dim 0 is the batch (beam search and
batched decoding index and reorder them along dim 0).

Mixers are built as `MixerCls(d_model, layer_idx=i, **options)`, where `options` is the config's dict
for that mixer name. Parameters that must stay out of weight decay carry `param._no_weight_decay = True`
(set where they are defined); the optimiser groups read that mark.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class Mixer(nn.Module):
    """Base class of sequence mixers: [B, L, D] -> [B, L, D] with a carried state."""

    d_model: int

    def forward(self, x: Tensor, state: Any | None = None) -> tuple[Tensor, Any]:
        raise NotImplementedError

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> Any:
        raise NotImplementedError


def no_weight_decay(param: nn.Parameter) -> nn.Parameter:
    """Mark a parameter so the optimiser puts it in the no-weight-decay group; returns it."""
    param._no_weight_decay = True
    return param
