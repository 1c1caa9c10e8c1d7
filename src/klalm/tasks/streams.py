"""Training batches made on the training device, into static buffers, from a step counter held in a device tensor.

A captured CUDA graph replays the same kernels on the same memory, so the data of step s must come from kernels
too, written into buffers that never move, as a function of a counter that the graph itself advances. Two sources:

- `FreshStream`: new sequences at every step (A5). Element e of step s under (seed, stream) is
  `mix(mix(c) ^ key) * V >> 32` with the counter c = s·(B·L) + e and key = mix(mix(seed) ^ stream), where `mix` is
  a bijective 32-bit integer hash (xor-shift, multiply by an odd constant, three times). Every element of a run has
  its own counter, so a stream never repeats within 2^32 elements, and every value depends only on (seed, stream,
  step, e): the same on any device and whatever other seeds train beside it. The labels come from the task's
  `labeler` (A5: the running group product). All of it is integer arithmetic on int64 tensors kept below 2^63.
- `SplitStream`: minibatches of a fixed training split (MQAR, MAD) in shuffled epochs, as `torch.randperm` under
  the seed draws them; the order of every step is laid out once on the device, so step s reads row s of it.

Both have `fill(step) -> (input_ids [B, L], labels [B, L])`, which writes the step's batch into the stream's own
`inputs` and `labels` buffers and returns them, and `scored_per_row`: K when every row scores exactly K positions
(the task's `scored_per_row`, MQAR), so training computes the logits of those positions only; else None.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from klalm.tasks.base import SyntheticTask

MASK32 = 0xFFFFFFFF
# Odd (so multiplying by it is a bijection mod 2^32) and below 2^27, so a product with a 32-bit value stays below 2^59.
MIX_MULTIPLIER = 0x45D9F3B
MAX_VOCAB = 2**31  # (32-bit hash) x vocab must stay below 2^63


def mix(x):
    """A bijective hash of 32-bit values (Python ints or int64 tensors in [0, 2^32)) to [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * MIX_MULTIPLIER) & MASK32
    x = x ^ (x >> 16)
    x = (x * MIX_MULTIPLIER) & MASK32
    return x ^ (x >> 16)


def stream_key(seed: int, stream: int) -> int:
    """The 32-bit key of one (seed, stream) pair (e.g. stream 0 = main batch, 1 = A5's auxiliary batch)."""
    return mix(mix(seed & MASK32) ^ (stream & MASK32))


def counter_ints(key: int, counters: Tensor, high: int) -> Tensor:
    """Uniform integers in [0, high), one per counter value (int64 in [0, 2^32)), for one stream key."""
    return (mix(mix(counters) ^ key) * high) >> 32


class FreshStream:
    """New sequences at every step: uniform tokens in [0, V) and the task's labels for them (see the module doc).

    Args:
        task: a task with `labeler(device)` (inputs are uniform tokens, labels a function of them: A5).
        batch_size: B, sequences per step.
        seed: the run's seed.
        stream: which stream of the seed (0: main batch; A5's auxiliary batch uses 1).
        steps: steps the run will draw (the counter s·B·L + e must stay below 2^32).
        device: where the buffers live and the batches are made.
    """

    def __init__(self, task: SyntheticTask, batch_size: int, seed: int, stream: int, steps: int, device):
        labeler = getattr(task, "labeler", None)
        if labeler is None:
            raise ValueError(f"{type(task).__name__} cannot draw fresh batches on the device; give it a training split")
        if task.vocab_size >= MAX_VOCAB:
            raise ValueError(f"vocab_size={task.vocab_size} is too large for the 32-bit stream (max {MAX_VOCAB - 1})")
        shape = (batch_size, task.seq_len)
        self.numel = math.prod(shape)
        if steps * self.numel > MASK32 + 1:
            raise ValueError(f"{steps} steps of {self.numel} tokens exceed the stream's 2^32 counters; use fewer steps")
        self.vocab_size, self.key, self.label = task.vocab_size, stream_key(seed, stream), labeler(device)
        self.scored_per_row = task.scored_per_row
        self.elements = torch.arange(self.numel, device=device).view(shape)  # [B, L]
        self.inputs = torch.empty(shape, dtype=torch.long, device=device)  # [B, L]
        self.labels = torch.empty(shape, dtype=torch.long, device=device)  # [B, L]

    def fill(self, step: Tensor) -> tuple[Tensor, Tensor]:
        """Write step `step`'s batch (step: a 0-d int64 tensor on the device) into the buffers; return them."""
        self.inputs.copy_(counter_ints(self.key, step * self.numel + self.elements, self.vocab_size))
        self.label(self.inputs, self.labels)
        return self.inputs, self.labels


class SplitStream:
    """Minibatches of a fixed split: epoch after epoch, a fresh permutation of the rows cut into whole batches.

    Args:
        inputs, labels: the split, [N, L] each, already on the device (shared by every member that trains on it).
        batch_size: B, rows per step (at most N; the last partial batch of an epoch is dropped).
        seed: seeds the permutations (torch.randperm on the CPU, so the order is the same on every device).
        steps: steps the run will draw.
        scored_per_row: K when every row of the split scores exactly K positions (the task's `scored_per_row`).
    """

    def __init__(self, inputs: Tensor, labels: Tensor, batch_size: int, seed: int, steps: int,
                 scored_per_row: int | None = None):  # fmt: skip
        rows = inputs.shape[0]
        batch_size = min(batch_size, rows)
        per_epoch = rows // batch_size
        generator = torch.Generator().manual_seed(seed)
        epochs = [torch.randperm(rows, generator=generator) for _ in range(-(-steps // per_epoch))]
        order = torch.cat([e[: per_epoch * batch_size].view(per_epoch, batch_size) for e in epochs])[:steps]
        self.order = order.to(inputs.device)  # [steps, B]
        self.scored_per_row = scored_per_row
        self.split_inputs, self.split_labels = inputs, labels
        self.inputs = inputs.new_empty(batch_size, inputs.shape[1])  # [B, L]
        self.labels = labels.new_empty(batch_size, labels.shape[1])  # [B, L]

    def fill(self, step: Tensor) -> tuple[Tensor, Tensor]:
        """Write step `step`'s batch (step: a 0-d int64 tensor on the device) into the buffers; return them."""
        rows = self.order.index_select(0, step.view(1)).view(-1)  # [B]
        torch.index_select(self.split_inputs, 0, rows, out=self.inputs)
        torch.index_select(self.split_labels, 0, rows, out=self.labels)
        return self.inputs, self.labels
