"""Helpers the multi-GPU trainer configs point at (configs/trainer/fsdp.yaml)."""

from __future__ import annotations

from torch import nn


def block_classes() -> set[type[nn.Module]]:
    """The module classes FSDP wraps as one shard unit each: the backbone's residual block."""
    from klalm.models.backbone import Block

    return {Block}
