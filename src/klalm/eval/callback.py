"""Optional zero-shot evaluation during training: a Lightning callback around `klalm.eval.evaluate_model`.

Every `every_n_steps` optimiser steps (and at the end of training, if asked) the global-zero rank evaluates the
LightningModule's `model` (an HF causal LM, the attribute klalm's `LMModule` has) with the datamodule's tokenizer
and writes `zeroshot/<task>_acc`, `zeroshot/<task>_acc_norm` (and their stderr) to every logger through
`logger.log_metrics`. Other ranks wait at a barrier. Task names and data files are checked in `setup`, before the
first step. Hydra (configs/callbacks, owned by training):

    zeroshot:
      _target_: klalm.eval.callback.ZeroShotEval
      data_dir: ${oc.env:KLALM_SHARED_DATA,../shared/data}
      every_n_steps: 2000
      limit: 500
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from klalm.eval.harness import METRICS, evaluate_model, resolve_tasks

log = logging.getLogger(__name__)


class ZeroShotEval(Callback):
    """Zero-shot lm-eval of the model being trained.

    Args:
        tasks: user-facing task names.
        data_dir: local data folder (layout of ../shared/data) → offline tasks; None → upstream hub tasks.
        every_n_steps: evaluate when the optimiser step is a multiple of this; 0 = never during training.
        at_end: also evaluate when training ends.
        limit: examples per task (the first ones); None = the whole validation set.
        batch_size: lm-eval requests per forward pass.
        max_length: context length in tokens handed to lm-eval.
    """

    def __init__(
        self,
        tasks: Sequence[str] = ("hellaswag", "piqa"),
        data_dir: str | Path | None = None,
        every_n_steps: int = 1000,
        at_end: bool = True,
        limit: int | None = 500,
        batch_size: int = 16,
        max_length: int = 2048,
    ) -> None:
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps={every_n_steps} must be ≥ 0")
        if limit is not None and limit < 1:
            raise ValueError(f"limit={limit} must be positive or None")
        self.tasks, self.data_dir = list(tasks), data_dir
        self.every_n_steps, self.at_end = every_n_steps, at_end
        self.limit, self.batch_size, self.max_length = limit, batch_size, max_length
        self._specs: list[Any] = []
        self._task_manager: Any = None
        self._last_step = -1
        self.history: list[dict[str, float]] = []  # every row logged on this rank, with its "step"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._specs, self._task_manager = resolve_tasks(self.tasks, self.data_dir)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and step != self._last_step:
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.at_end and trainer.global_step != self._last_step:
            self.evaluate(trainer, pl_module)

    def evaluate(self, trainer: Any, pl_module: Any) -> dict[str, float]:
        """Evaluate now on global zero, log and return the metrics ({} on other ranks)."""
        self._last_step = step = trainer.global_step
        row: dict[str, float] = {}
        if trainer.is_global_zero:
            tokenizer = getattr(trainer.datamodule, "tokenizer", None)
            if tokenizer is None:
                raise AttributeError("ZeroShotEval needs trainer.datamodule.tokenizer (an HF tokenizer)")
            was_training = pl_module.model.training
            pl_module.model.eval()
            try:
                metrics, _ = evaluate_model(
                    pl_module.model,
                    tokenizer,
                    self._specs,
                    self._task_manager,
                    limit=self.limit,
                    batch_size=self.batch_size,
                    max_length=self.max_length,
                )
            finally:
                pl_module.model.train(was_training)
            for task, scores in metrics.items():
                for metric in METRICS:
                    row[f"zeroshot/{task}_{metric}"] = scores[metric]
                    if scores[f"{metric}_stderr"] is not None:  # (None for limit=1)
                        row[f"zeroshot/{task}_{metric}_stderr"] = scores[f"{metric}_stderr"]
            for logger in trainer.loggers:
                logger.log_metrics(row, step=step)
            self.history.append({"step": step, **row})
            log.info("zero-shot at step %d: %s", step, {k: round(v, 4) for k, v in row.items() if "stderr" not in k})
        trainer.strategy.barrier()
        return row
