"""A plain torch training loop for the synthetic tasks: AdamW, warmup + cosine, bf16 autocast on CUDA,
cross-entropy on the scored positions only, and held-out accuracy.

Budgets: a run stops after `steps` optimiser steps or after `time_limit_s` seconds of training, whichever comes
first. The learning-rate schedule follows the run's progress p = max(step / steps, elapsed / time_limit), so a
time-limited run still warms up and decays fully. One untimed forward/backward runs first so that kernel
compilation (Triton JIT) is not charged to the time limit.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from klalm.tasks.base import IGNORE_INDEX, SyntheticTask, chunk_generator

Batch = tuple[Tensor, Tensor]
LOSS_EVERY = 10  # steps between logged (device-synchronising) loss values


@dataclasses.dataclass
class TrainSettings:
    """Optimisation settings of one run.

    Args:
        steps: maximum optimiser steps.
        batch_size: sequences per step.
        lr: peak learning rate.
        min_lr: learning rate at the end of the cosine.
        warmup_frac: fraction of the run spent in linear warmup.
        weight_decay: AdamW decoupled weight decay of matrices (not of embeddings, norms, biases, or
            parameters marked `_no_weight_decay`).
        grad_clip: global gradient-norm clip (0 disables).
        aux_batch_size: A5 only: sequences of length 2 added at every step (SLiCE); 0 disables.
        eval_batch_size: sequences per evaluation forward.
        time_limit_s: wall-clock limit of the training loop, seconds (None: steps only).
    """

    steps: int = 1000
    batch_size: int = 64
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_frac: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    aux_batch_size: int = 0
    eval_batch_size: int = 256
    time_limit_s: float | None = None


class LastPositionDecoder(nn.Module):
    """MAD's compression readout: rebuild L tokens from the LM's final hidden state at the last position.

    The LM's final (normed) hidden states are captured from the input of its output embedding, so any model with
    `get_output_embeddings()` works. Decoder (MAD's AutoEncoder): h_last + sinusoidal position embedding of each
    output slot -> [LayerNorm, Linear, GELU] x 2 -> LayerNorm -> Linear(D, V).

    Args:
        model: a causal LM (forward(input_ids).logits, get_output_embeddings()).
        d_model: D, the LM's hidden width.
        seq_len: L, output slots.
        vocab_size: V, output classes.
    """

    def __init__(self, model: nn.Module, d_model: int, seq_len: int, vocab_size: int):
        super().__init__()
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no output embedding to read hidden states from")
        self.model = model
        self._hidden: Tensor | None = None
        head.register_forward_pre_hook(self._capture)
        self.register_buffer("positions", _sincos(seq_len, d_model), persistent=False)  # [L, D]
        layers = [m for _ in range(2) for m in (nn.LayerNorm(d_model), nn.Linear(d_model, d_model), nn.GELU())]
        self.decoder = nn.Sequential(*layers, nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size))

    def _capture(self, module: nn.Module, args: tuple[Tensor, ...]) -> None:
        self._hidden = args[0]

    def forward(self, input_ids: Tensor) -> Tensor:
        """input_ids [B, L] -> logits [B, L, V] for the L reconstructed tokens."""
        self.model(input_ids)
        last = self._hidden[:, -1]  # [B, D]
        self._hidden = None
        return self.decoder(last[:, None, :] + self.positions.to(last.dtype))  # [B, L, V]


def _sincos(length: int, dim: int) -> Tensor:
    """Sinusoidal position embeddings [length, dim] (sin in even, cos in odd columns)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # [L, 1]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10_000.0) / dim))  # [D/2]
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table


class TokenReadout(nn.Module):
    """The usual readout: the LM's logits at every position."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor) -> Tensor:
        """input_ids [B, L] -> logits [B, L, V]."""
        return self.model(input_ids).logits


def wrap_readout(model: nn.Module, task: SyntheticTask, d_model: int) -> nn.Module:
    """The module to train for `task`: the LM itself, or the LM plus MAD's last-position decoder."""
    readouts: dict[str, Callable[[], nn.Module]] = {
        "token": lambda: TokenReadout(model),
        "last_position": lambda: LastPositionDecoder(model, d_model, task.seq_len, task.vocab_size),
    }
    return readouts[task.readout]()


def masked_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over positions with labels != -100; logits [B, L, V], labels [B, L]; float32."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


class SplitBatches:
    """Random minibatches of a fixed split, one shuffled epoch after another (on the split's device)."""

    def __init__(self, inputs: Tensor, labels: Tensor, batch_size: int, seed: int):
        self.inputs, self.labels, self.batch_size = inputs, labels, min(batch_size, inputs.shape[0])
        self.generator = torch.Generator().manual_seed(seed)
        self._order, self._cursor = torch.empty(0, dtype=torch.long), 0

    def __call__(self, step: int) -> Batch:
        if self._cursor + self.batch_size > self._order.numel():
            self._order, self._cursor = torch.randperm(self.inputs.shape[0], generator=self.generator), 0
        rows = self._order[self._cursor : self._cursor + self.batch_size].to(self.inputs.device)
        self._cursor += self.batch_size
        return self.inputs[rows], self.labels[rows]


class FreshBatches:
    """A new batch of a task at every step (batch of step s = chunk s of the train split): infinite data."""

    def __init__(self, task: SyntheticTask, batch_size: int, seed: int, device: torch.device):
        self.task, self.batch_size, self.seed, self.device = task, batch_size, seed, device

    def __call__(self, step: int) -> Batch:
        inputs, labels = self.task.sample(self.batch_size, chunk_generator(self.seed, "train", step), "train")
        return inputs.to(self.device), labels.to(self.device)


def _optimizer(module: nn.Module, settings: TrainSettings) -> torch.optim.AdamW:
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for param in module.parameters():
        plain = param.ndim < 2 or id(param) in embeddings or getattr(param, "_no_weight_decay", False)
        (no_decay if plain else decay).append(param)
    groups = [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.98))


def lr_at(progress: float, settings: TrainSettings) -> float:
    """Learning rate at run progress p in [0, 1]: linear warmup, then cosine from lr to min_lr."""
    if progress < settings.warmup_frac:
        return settings.lr * max(progress / settings.warmup_frac, 1e-3)
    decay = (progress - settings.warmup_frac) / max(1.0 - settings.warmup_frac, 1e-9)
    return settings.min_lr + 0.5 * (settings.lr - settings.min_lr) * (1 + math.cos(math.pi * min(decay, 1.0)))


def _loss(module: nn.Module, batches: list[Batch], device: torch.device) -> Tensor:
    """Sum over batches of each batch's mean masked cross-entropy, under bf16 autocast on CUDA."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        return sum(masked_cross_entropy(module(inputs), labels) for inputs, labels in batches)


def train(
    module: nn.Module,
    next_batch: Callable[[int], Batch],
    settings: TrainSettings,
    device: torch.device,
    aux_batch: Callable[[int], Batch] | None = None,
) -> dict[str, float]:
    """Train `module` in place.

    Args:
        module: maps input_ids [B, L] to logits [B, L, V] (see `wrap_readout`).
        next_batch: step -> (input_ids [B, L], labels [B, L]) on `device`.
        settings: optimisation settings.
        device: where the module lives.
        aux_batch: optional second batch per step (A5's length-2 sequences); its mean loss is added.

    Returns:
        {"steps", "planned_steps", "train_time_s", "final_loss"}: steps taken (fewer than planned_steps when the time
        limit ended the run) and the loss as the mean of the last 5 logged steps (one every LOSS_EVERY).
    """
    optimizer = _optimizer(module, settings)
    module.train()
    warmup = [next_batch(0)] + ([aux_batch(0)] if aux_batch is not None else [])
    _loss(module, warmup, device).backward()  # untimed: compiles kernels for both batch shapes
    optimizer.zero_grad(set_to_none=True)
    losses: list[float] = []
    start, step, progress = time.perf_counter(), 0, 0.0
    while progress < 1.0:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(progress, settings)
        batches = [next_batch(step)] + ([aux_batch(step)] if aux_batch is not None else [])
        loss = _loss(module, batches, device)
        loss.backward()
        if settings.grad_clip > 0:
            nn.utils.clip_grad_norm_(module.parameters(), settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % LOSS_EVERY == 0:
            losses.append(float(loss.detach()))  # a device sync, so only every LOSS_EVERY steps
        step += 1
        elapsed = time.perf_counter() - start
        progress = step / settings.steps
        if settings.time_limit_s is not None:
            progress = max(progress, elapsed / settings.time_limit_s)
    tail = losses[-5:]
    return {
        "steps": step,
        "planned_steps": settings.steps,
        "train_time_s": time.perf_counter() - start,
        "final_loss": sum(tail) / len(tail),
    }


@torch.no_grad()
def evaluate(module: nn.Module, inputs: Tensor, labels: Tensor, batch_size: int, device: torch.device) -> dict:
    """Held-out accuracy on the scored positions.

    Args:
        module: maps input_ids [B, L] to logits [B, L, V].
        inputs, labels: the test split, [N, L] each (any device).
        batch_size: sequences per forward.
        device: where the module lives.

    Returns:
        {"token_acc": correct scored tokens / scored tokens, "seq_acc": sequences with every scored token correct
        / sequences with at least one scored token, "scored_tokens": count}.
    """
    module.eval()
    correct = total = seq_correct = seq_total = 0
    for lo in range(0, inputs.shape[0], batch_size):
        x, y = inputs[lo : lo + batch_size].to(device), labels[lo : lo + batch_size].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            predictions = module(x).argmax(-1)  # [B, L]
        scored = y != IGNORE_INDEX
        hits = (predictions == y) & scored
        correct += int(hits.sum())
        total += int(scored.sum())
        has_scored = scored.any(1)
        seq_correct += int(((hits == scored).all(1) & has_scored).sum())
        seq_total += int(has_scored.sum())
    module.train()
    if total == 0:
        raise ValueError("the test split has no scored positions (every label is -100)")
    return {"token_acc": correct / total, "seq_acc": seq_correct / max(seq_total, 1), "scored_tokens": total}
