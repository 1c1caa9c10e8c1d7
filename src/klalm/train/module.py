"""The LightningModule that pretrains a klalm causal LM (the `nn.Module` itself stays Lightning-free).

One `training_step` is one optimiser step: it pulls `accumulate` micro-batches from the loader itself
(`dataloader_iter`), so checkpoints always fall on step boundaries and the saved loader position is exact.
Optimisation is manual so that a step with a non-finite loss, gradient or parameter can be skipped on every rank
at once:

    for each micro-batch: loss = CE(model(input_ids), labels); backward(loss / accumulate)  (DDP syncs on the last)
    grad_norm = global L2 norm (clipped to `grad_clip`)
    bad = non-finite loss, grad_norm or parameter on any rank (one collective)
    optimiser step that leaves parameters and moments unchanged when bad; scheduler step (a skipped step still
        counts as a step: its tokens, its learning rate, `global_step`)
    bad → count and warn; `max_bad_steps` in a row → stop with `NonFiniteLossError`, naming the learning rate

How a bad step is skipped depends on the optimiser. A fused one (`optim.fused=true`, the default) takes `bad` as its
`found_inf` (the flag torch's GradScaler uses) and skips on the device, so the host never waits for the GPU inside a
step: it reads the flag one step later, from a pinned copy the GPU wrote long before (`HostFlag`), and launches the
next step's kernels meanwhile.
Others need the flag on the host first (one synchronisation a step); a bad step then drops its gradients, so the
optimiser's step leaves every parameter and moment as it was. Both skip the same steps and give the same parameters
(tests/train/test_app.py).

Forward passes run with the ops' default value checks suspended (`klalm.ops.checks.value_checks_suspended`), so
that a diverging KLA model reaches the same skip-and-count path as every other architecture instead of stopping in
the scan's input check on CPUs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from klalm.config_checks import COMPILE, ConfigError
from klalm.loss import scored_tokens, token_cross_entropy
from klalm.models import prepare_backends
from klalm.ops.checks import value_checks_suspended
from klalm.train.budget import TokenBudget
from klalm.train.distributed import FSDPStrategy, HostFlag, block_classes, shard_model
from klalm.train.optim import classify_parameters, param_groups

log = logging.getLogger(__name__)

# LMModule pulls its micro-batches itself (`training_step(dataloader_iter)`) on purpose; Lightning warns about that
# flavour on every fit ("experimental", "will not work well with gradient accumulation", which it does not manage).
warnings.filterwarnings("ignore", message=r".*`dataloader_iter`.*")
# Lightning 2.6's pytree helper uses torch's LeafSpec, which torch ≥ 2.10 deprecates, once per fit.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


class NonFiniteLossError(FloatingPointError):
    """Raised after `max_bad_steps` consecutive optimiser steps with a non-finite loss, gradient or parameter."""


def lm_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Mean next-token cross entropy (float32 or wider) and the number of scored tokens.

    Args:
        logits: [B, T, V], any float dtype.
        labels: [B, T] next-token ids (already shifted); IGNORE_INDEX (`klalm.loss`) positions are not scored.

    Returns:
        (loss, count): scalar mean loss in nats/token and the scalar number of scored tokens.
    """
    return token_cross_entropy(logits, labels), scored_tokens(labels)


def rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from (python, numpy, torch CPU, and CUDA of this process's device).

    Only the current device's CUDA generator is saved (one device per rank), so a checkpoint written on N GPUs
    restores on a machine with fewer. Everything is a tensor or plain Python data (numpy's key array becomes a
    list of ints), so checkpoints load with `torch.load(..., weights_only=True)`.
    """
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    numpy_state = (name, keys.tolist(), pos, has_gauss, cached_gaussian)
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores the RNGs saved by `rng_state` (CUDA: into the current device's generator)."""
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _global_norm(tensors: list[Tensor]) -> Tensor:
    """L2 norm over a list of tensors, float32; FSDP2's sharded norms are combined over all ranks."""
    total = torch.nn.utils.get_total_norm(tensors, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    return total.float()


def _all_finite(tensors: list[Tensor]) -> Tensor:
    """Whether every element of this rank's tensors (local shards under FSDP2) is finite, as a 0-d bool tensor. The
    step's reduction combines the ranks.

    The max-norm max|x| is finite exactly when every element is: it cannot overflow on large finite weights (an L2
    norm can), and NaN propagates through torch's max reductions (the foreach kernels use a NaN-propagating max).
    It takes a few multi-tensor kernels however many tensors there are; `isfinite(t).all()` per tensor took five
    kernels for each (560 launches a step for kla_45m's 112 parameters). The tensors are detached first: torch's
    foreach norm falls back to one reduction per tensor for tensors that require grad, even under no_grad (kla_45m
    on an H200: 147 kernels, 0.67 ms as parameters; 11 kernels, 0.07 ms detached; results/gpu_2026-12-02f)."""
    local = [(t.to_local() if isinstance(t, DTensor) else t).detach() for t in tensors]
    filled = [t for t in local if t.numel() > 0]  # a max has no identity: empty shards (FSDP2) are left out
    if not filled:
        return torch.ones((), dtype=torch.bool, device=local[0].device)
    return torch.isfinite(torch.nn.utils.get_total_norm(filled, norm_type=float("inf")))


@dataclasses.dataclass(frozen=True)
class _StepRecord:
    """What a skipped step's warning needs, kept on the device until the host reads `bad`."""

    bad: HostFlag  # any rank saw a non-finite loss, gradient or parameter
    loss: Tensor
    grad_norm: Tensor
    params_finite: Tensor
    step: int
    lr: float


def _skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimiser skips a step from a `found_inf` flag on the device: torch's fused Adam/AdamW/SGD."""
    return bool(optimizer.defaults.get("fused"))


class LMModule(pl.LightningModule):
    """Causal-LM pretraining around any klalm model (`forward(input_ids).logits` → [B, T, V]).

    Args:
        model: the causal LM (`transformers.PreTrainedModel`).
        optimizer: partial optimiser taking parameter groups (from `configs/optim`, `_partial_: true`); its `lr` and
            `weight_decay` keywords set the groups.
        scheduler: partial schedule taking (optimizer, total_steps) (from `configs/scheduler`).
        budget: the run's derived token budget (accumulation and step count).
        grad_clip: max global L2 norm of the gradient; 0 disables clipping (the norm is still logged).
        max_bad_steps: consecutive non-finite steps tolerated before stopping with `NonFiniteLossError`.
        dynamics_lr_scale: lr multiplier of parameters marked `_no_weight_decay` (the KLA/SSM dynamics).
        compile: False; True to compile the model in place with `torch.compile` as one graph (parameter names
            unchanged); or "blocks" to compile each backbone block on its own (the embedding, final norm and head
            stay eager), so that identical blocks share one compiled graph and the compile time does not grow with
            the depth (torchtitan's way). Either also compiles the loss (`lm_loss`), so that its float32 cast,
            log-softmax and NLL fuse, forward and backward.
        activation_checkpointing: recompute each backbone block in the backward pass instead of storing its
            activations (non-reentrant `torch.utils.checkpoint`); saves memory, costs about one extra forward.
        meta: stored in every checkpoint under "klalm" (model config, vocab size) so `load_model` can rebuild it.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler],
        budget: TokenBudget,
        *,
        grad_clip: float = 1.0,
        max_bad_steps: int = 10,
        dynamics_lr_scale: float = 1.0,
        compile: bool | str = False,
        activation_checkpointing: bool = False,
        meta: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if max_bad_steps < 1:
            raise ValueError(f"train.max_bad_steps={max_bad_steps} must be ≥ 1")
        valid, choices = COMPILE
        if not valid(compile):
            raise ValueError(f"train.compile={compile!r} is invalid: must be {choices}")
        self.automatic_optimization = False
        self.model = model
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.budget, self.grad_clip, self.max_bad_steps = budget, grad_clip, max_bad_steps
        self.dynamics_lr_scale, self.compile_model, self.meta = dynamics_lr_scale, compile, meta or {}
        self.activation_checkpointing = activation_checkpointing
        self.lm_loss = torch.compile(lm_loss) if compile else lm_loss
        self.param_classes = classify_parameters(model)  # before any wrapping hides the _no_weight_decay marks
        self.tokens_seen = 0
        self.bad_steps_total = 0
        self.bad_steps_in_row = 0
        self._unchecked: _StepRecord | None = None  # the last step whose bad flag the host has not read yet
        self._val_sums: list[Tensor] = []
        self.step_metrics: dict[str, Any] = {}
        # val/loss and val/ppl of the latest validation and the optimiser step it ran at, kept in checkpoints so that a
        # run resumed from one saved after its last step's validation does not validate that step again (`app.finish`)
        self.last_val: dict[str, float] = {}
        self.last_val_step = -1
        self._configured = False

    def configure_model(self) -> None:
        """Activation checkpointing, FSDP2 sharding (trainer=fsdp) and compilation, once (Lightning calls this hook
        for fit and again for validate)."""
        if self._configured:
            return
        self._configured = True
        if self.activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

            blocks = block_classes()
            apply_activation_checkpointing(self.model, check_fn=lambda module: isinstance(module, blocks))
        strategy = self._trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, FSDPStrategy):
            shard_model(self.model, self.device_mesh["data_parallel"], strategy.reshard_after_forward)
        if self.compile_model:
            # made inside the trace, a backend choice would split the compiled graph; the model may not be on its
            # device yet (Lightning moves it after this hook), so the strategy names the device
            device = strategy.root_device if strategy is not None else self.device
            prepare_backends(self.model, device)
            if device.type == "cpu":
                log.warning(
                    "train.compile=%s on the CPU: inductor builds C++ kernels first, which can take minutes even for "
                    "a tiny model (blocks compiles faster); it pays on GPUs",
                    self.compile_model,
                )
            if self.compile_model == "blocks":
                blocks = block_classes()
                for module in self.model.modules():
                    if isinstance(module, blocks):
                        module.compile()
            else:
                self.model.compile()

    def forward(self, input_ids: Tensor) -> Tensor:
        """Logits [B, T, V] for input_ids [B, T]; non-finite values flow through to the loss (module docstring)."""
        with value_checks_suspended():
            return self.model(input_ids).logits

    def configure_optimizers(self) -> dict[str, Any]:
        base = self.optimizer_factory.keywords
        for key in ("lr", "weight_decay"):
            if key not in base:
                raise KeyError(f"optim.{key} must be set (the parameter groups are built from it)")
        groups = param_groups(
            list(self.named_parameters()),
            {f"model.{k}": v for k, v in self.param_classes.items()},
            lr=base["lr"],
            weight_decay=base["weight_decay"],
            dynamics_lr_scale=self.dynamics_lr_scale,
        )
        optimizer = self.optimizer_factory(groups)
        scheduler = self.scheduler_factory(optimizer, self.budget.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def training_step(self, dataloader_iter: Iterator) -> None:
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.budget.accumulate):
            batch, _, _ = next(dataloader_iter)
            batch = self.trainer.strategy.batch_to_device(batch)  # the dataloader_iter flavour leaves this to us
            with self._grad_sync(micro == self.budget.accumulate - 1):
                loss, _ = self.lm_loss(self(batch["input_ids"]), batch["labels"])
                self.manual_backward(loss / self.budget.accumulate)
            loss_sum += loss.detach()
        self.tokens_seen += self.budget.tokens_per_step
        grad_norm = self._clip_and_norm()
        params_finite = _all_finite(list(self.parameters()))
        loss, bad = self._reduce_step(loss_sum / self.budget.accumulate, grad_norm, params_finite)
        record = _StepRecord(
            HostFlag(bad), loss, grad_norm, params_finite, self.global_step, scheduler.get_last_lr()[0]
        )
        inner = getattr(optimizer, "optimizer", optimizer)  # Lightning's wrapper holds the torch optimiser
        on_device = _skips_on_device(inner)
        if on_device:
            inner.found_inf = bad  # read by the fused kernel: no update, and its step count is restored
        elif record.bad.value():  # the one synchronisation of a step, for optimisers without found_inf
            optimizer.zero_grad(set_to_none=True)  # parameters without a gradient are left alone, moments included
        optimizer.step()
        scheduler.step()
        self._log_step(loss, grad_norm, record.lr)
        self.check_skipped_steps()  # on the device path the previous step's flag, which the GPU wrote long ago
        self._unchecked = record
        if not on_device:
            self.check_skipped_steps()  # this step's, already on the host

    def _grad_sync(self, sync: bool) -> contextlib.AbstractContextManager:
        """Context of one micro-batch's forward and backward: gradient all-reduce (DDP) or reduce-scatter (FSDP2)
        only when `sync` (the last micro-batch of the step); local accumulation otherwise."""
        if hasattr(self.model, "set_requires_gradient_sync"):  # FSDP2 root module
            self.model.set_requires_gradient_sync(sync)
            return contextlib.nullcontext()
        if sync or not hasattr(self.trainer.strategy, "block_backward_sync"):  # single device: nothing to sync
            return contextlib.nullcontext()
        return self.trainer.strategy.block_backward_sync()  # DDP no_sync

    def _clip_and_norm(self) -> Tensor:
        """Global gradient L2 norm before clipping; with FSDP2 the sharded norms are combined over all ranks."""
        params = [p for p in self.parameters() if p.grad is not None]
        total = _global_norm([p.grad for p in params])
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, total)
        return total

    def _reduce_step(self, local_loss: Tensor, grad_norm: Tensor, params_finite: Tensor) -> tuple[Tensor, Tensor]:
        """Mean loss over ranks (this rank's own loss on a bad step) and a float32 flag, 1 where any rank saw a
        non-finite loss, gradient or parameter: one collective, no synchronisation."""
        bad = (~torch.isfinite(local_loss) | ~torch.isfinite(grad_norm) | ~params_finite).float()
        stats = torch.stack([torch.nan_to_num(local_loss, nan=0.0, posinf=0.0, neginf=0.0), bad])
        stats = self.trainer.strategy.reduce(stats, reduce_op="sum")
        any_bad = (stats[1] > 0).float()
        loss = torch.where(any_bad > 0, local_loss, stats[0] / self.trainer.world_size)
        return loss, any_bad

    def check_skipped_steps(self) -> None:
        """Reads the bad flag of the last step not read yet (waiting for the GPU to write it, if it has not): counts
        a skipped step, warns, and raises `NonFiniteLossError` after `max_bad_steps` in a row. Called by every step,
        and before anything reports the counts (checkpoints, `StepMetrics`, the end of training)."""
        record, self._unchecked = self._unchecked, None
        if record is None:
            return
        if not record.bad.value():
            self.bad_steps_in_row = 0
            return
        self.bad_steps_total += 1
        self.bad_steps_in_row += 1
        self.step_metrics["train/skipped_steps"] = self.bad_steps_total  # the row StepMetrics writes next
        what = f"loss={record.loss.item():.4g}, grad_norm={record.grad_norm.item():.4g}"
        what += "" if bool(record.params_finite) else ", non-finite parameters"
        lr = f"lr {record.lr:.3g} (optim.lr={self.optimizer_factory.keywords['lr']:g})"
        log.warning(
            "non-finite step skipped (%s at step %d, %s); %d in a row, %d in total",
            what, record.step, lr, self.bad_steps_in_row, self.bad_steps_total,
        )  # fmt: skip
        if self.bad_steps_in_row >= self.max_bad_steps:
            raise NonFiniteLossError(
                f"{self.bad_steps_in_row} consecutive optimiser steps were non-finite (last: {what}, step "
                f"{record.step}): the run diverged at {lr}; lower optim.lr, check the data, or raise "
                "train.max_bad_steps"
            )

    def _log_step(self, loss: Tensor, grad_norm: Tensor, lr: float) -> None:
        """Keeps this step's metrics for `StepMetrics`, which writes them every `trainer.log_every_n_steps` steps (the
        progress bar shows its latest row). Not `self.log`: Lightning's moves its metric state to the value's device
        on every call; without it a nearly all-host step on a 2-core CPU went from 9.1 to 6.9 ms
        (results/cpu_2026-12-02c), host time in which the GPU waits.

        `lr` is the learning rate this step's update used (the first group's), read before the scheduler stepped:
        read after, it would be the next step's."""
        self.step_metrics = {
            "train/loss": loss.detach(),
            "train/grad_norm": grad_norm.detach(),
            "train/lr": lr,
            "train/skipped_steps": self.bad_steps_total,
        }

    def on_validation_epoch_start(self) -> None:
        self._val_sums = []

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        loss, count = self.lm_loss(self(batch["input_ids"]), batch["labels"])
        self._val_sums.append(torch.stack([loss.detach() * count, count.to(loss.dtype)]))

    def on_validation_epoch_end(self) -> None:
        local = torch.stack(self._val_sums).sum(0) if self._val_sums else torch.zeros(2, device=self.device)
        total = self.trainer.strategy.reduce(local, reduce_op="sum")
        if total[1] <= 0:  # (a ConfigError: klalm-train prints it in one line, not in Hydra's traceback)
            raise ConfigError(
                "the validation data gave no batch: with data.val_batches=null (one pass) it must hold a batch of "
                "data.val_batch_size x (data.seq_len + 1) tokens per loader worker; set data.val_batches to read "
                "that many batches, wrapping around it"
            )
        val_loss = total[0] / total[1]
        metrics = {"val/loss": val_loss, "val/ppl": torch.exp(val_loss)}
        # to the progress bar (and last_val for the run summary); the loggers get the row at the optimiser step itself
        # (Lightning's own logging step lags it by one inside the training loop)
        self.log_dict(metrics, sync_dist=False, prog_bar=True, logger=False)
        self.last_val = {k: float(v) for k, v in metrics.items()}
        self.last_val_step = self.global_step
        for logger in self.trainer.loggers:
            logger.log_metrics(self.last_val, step=self.global_step)

    def on_train_end(self) -> None:
        self.check_skipped_steps()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.check_skipped_steps()
        checkpoint["klalm"] = {
            **self.meta,
            "tokens_seen": self.tokens_seen,
            "bad_steps_total": self.bad_steps_total,
            "bad_steps_in_row": self.bad_steps_in_row,
            "last_val": self.last_val,
            "last_val_step": self.last_val_step,
            "rng": rng_state(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        meta = checkpoint["klalm"]
        self.tokens_seen = meta["tokens_seen"]
        self.bad_steps_total = meta["bad_steps_total"]
        self.bad_steps_in_row = meta["bad_steps_in_row"]
        # a checkpoint written before these were saved says nothing of its validation: the app validates again at the
        # end, as it did then
        self.last_val = meta.get("last_val", {})
        self.last_val_step = meta.get("last_val_step", -1)
        set_rng_state(meta["rng"])
