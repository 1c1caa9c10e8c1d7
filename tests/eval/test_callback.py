"""ZeroShotEval inside a real (tiny, CPU) Lightning run: evaluates on schedule, logs, restores train mode."""

from __future__ import annotations

import csv

import lightning.pytorch as pl
import pytest
import torch

from klalm.eval.callback import ZeroShotEval
from klalm.models import build_model


class _TinyLM(pl.LightningModule):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.model = build_model("gpt", preset="tiny", vocab_size=vocab_size)
        self.modes_seen: list[bool] = []

    def training_step(self, batch, batch_idx):
        self.modes_seen.append(self.model.training)
        logits = self.model(input_ids=batch[:, :-1]).logits  # [B, T, V]
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Data(pl.LightningDataModule):
    def __init__(self, tokenizer) -> None:
        super().__init__()
        self.tokenizer = tokenizer

    def train_dataloader(self):
        ids = torch.randint(0, len(self.tokenizer), (8, 17), generator=torch.Generator().manual_seed(0))
        return torch.utils.data.DataLoader(ids, batch_size=2)


def _trainer(tmp_path, callback, **options) -> pl.Trainer:
    """A CPU trainer with `callback`, logging to a CSV file under `tmp_path`, and nothing else."""
    return pl.Trainer(accelerator="cpu", logger=pl.loggers.CSVLogger(tmp_path), callbacks=[callback],
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      **options)  # fmt: skip


def test_evaluates_every_n_steps_and_at_end(tmp_path, shared_data, gpt2_tokenizer):
    callback = ZeroShotEval(tasks=["piqa"], data_dir=shared_data, every_n_steps=2, limit=3, batch_size=3)
    module = _TinyLM(len(gpt2_tokenizer))
    trainer = _trainer(tmp_path, callback, max_steps=3, log_every_n_steps=1)
    trainer.fit(module, datamodule=_Data(gpt2_tokenizer))
    assert [row["step"] for row in callback.history] == [2, 3]
    assert all(0.0 <= row["zeroshot/piqa_acc"] <= 1.0 for row in callback.history)
    assert all(module.modes_seen)  # training resumed in train mode after the step-2 evaluation
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv") as handle:
        logged = [row for row in csv.DictReader(handle) if row.get("zeroshot/piqa_acc_norm")]
    assert [int(row["step"]) for row in logged] == [2, 3]


def test_bad_task_fails_in_setup(tmp_path, shared_data):
    callback = ZeroShotEval(tasks=["nope"], data_dir=shared_data)
    with pytest.raises(KeyError, match="'hellaswag', 'piqa'"):
        callback.setup(trainer=None, pl_module=None, stage="fit")


def test_a_stderr_lm_eval_cannot_compute_is_not_logged(tmp_path, shared_data, gpt2_tokenizer):
    """limit=1: no stderr (None) is left out of the row, not handed to the loggers as lm-eval's "N/A"."""
    callback = ZeroShotEval(tasks=["piqa"], data_dir=shared_data, every_n_steps=0, limit=1, batch_size=2)
    module = _TinyLM(len(gpt2_tokenizer))
    trainer = _trainer(tmp_path, callback, max_steps=1)
    trainer.fit(module, datamodule=_Data(gpt2_tokenizer))
    [row] = callback.history
    assert sorted(row) == ["step", "zeroshot/piqa_acc", "zeroshot/piqa_acc_norm"]
