"""Sharded data parallelism (FSDP2, `torch.distributed.fsdp.fully_shard`) for the trainer config `trainer=fsdp`.

`FSDPStrategy` is Lightning's `ModelParallelStrategy` fixed to pure data parallelism: one device-mesh dimension over
every rank of every node (no tensor parallelism), full (rank-0) checkpoints so they resume on any number of devices
and load with `klalm.models.checkpoint.load_model`. The sharding itself is applied by `LMModule.configure_model`
through `shard_model`: each backbone block is one FSDP unit, the whole model the root unit. FSDP2 hooks the
forward of every unit, so `LMModule`'s several micro-batch forwards inside one step each gather their parameters,
and `set_requires_gradient_sync(False)` skips the reduce-scatter of all but the last micro-batch.

`gather_objects` collects one Python object per rank (loader states for checkpoints, skipped-record counts for the
metrics) under any data-parallel strategy. `HostFlag` brings a flag that the ranks agreed on (a non-finite step, a
SIGTERM) to the host a step later without waiting for the GPU's later work.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import Tensor, nn


def gather_objects(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...]; [obj] without a process group (a collective: every rank must call it)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


class HostFlag:
    """A 0-dim device tensor on its way to the host. On CUDA the copy goes into pinned memory behind the work queued
    so far, and `value()` waits for that copy alone: reading a CUDA tensor directly (`bool(t)`) would queue its copy
    behind everything launched since, and wait for all of it."""

    def __init__(self, flag: Tensor) -> None:
        self._event = None
        if flag.device.type == "cuda":
            self._value = torch.empty((), dtype=flag.dtype, pin_memory=True).copy_(flag, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._value = flag

    def value(self) -> bool:
        if self._event is not None:
            self._event.synchronize()
        return bool(self._value)


def block_classes() -> tuple[type[nn.Module], ...]:
    """The module classes that become one FSDP unit each: the backbone's residual block."""
    from klalm.models.backbone import Block

    return (Block,)


def shard_model(model: nn.Module, mesh: Any, reshard_after_forward: bool = True) -> nn.Module:
    """Applies FSDP2 in place: every block is one unit, then the root (embedding, final norm, LM head).

    Args:
        model: the causal LM (unwrapped, or with activation-checkpointed blocks).
        mesh: 1-D data-parallel `DeviceMesh`.
        reshard_after_forward: free gathered block parameters after each forward (ZeRO-3); False keeps them until
            the backward (ZeRO-2-like, more memory, fewer all-gathers).
    """
    from torch.distributed.fsdp import fully_shard

    blocks = block_classes()
    for module in model.modules():
        inner = getattr(module, "_checkpoint_wrapped_module", module)
        if isinstance(inner, blocks):
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


class FSDPStrategy(ModelParallelStrategy):
    """FSDP2 over all ranks (data parallel size = world size, tensor parallel size 1), full checkpoints.

    Args:
        reshard_after_forward: see `shard_model`.
        process_group_backend: None picks nccl on GPUs, gloo on CPUs.
    """

    def __init__(self, reshard_after_forward: bool = True, process_group_backend: str | None = None) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=False,
            process_group_backend=process_group_backend,
        )
        self.reshard_after_forward = reshard_after_forward

    def _setup_distributed(self) -> None:
        super()._setup_distributed()
        self._data_parallel_size = self.world_size  # pure data parallel: every rank holds one shard
