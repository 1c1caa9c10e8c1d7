"""Exact resume: after N batches, a loader restored from the saved state yields the identical next batches."""

from __future__ import annotations

import io

import lightning as L
import pytest
import torch

from klalm.data import PackedTextDataset, ResumableLoader, TextDataModule, build_source
from klalm.data.loader import LoaderStateError

SEQ_LEN, BATCH, DOCS = 255, 4, 6  # ~14 batches per epoch (~7 per worker): 18 batches cross an epoch boundary


def _source(enwiki):
    return build_source({"kind": "files", "paths": str(enwiki / "enwiki-00009-*.jsonl.gz"), "max_documents": DOCS})


def _loader(enwiki, gpt2, workers: int) -> ResumableLoader:
    dataset = PackedTextDataset(
        _source(enwiki),
        gpt2,
        seq_len=SEQ_LEN,
        batch_size=BATCH,
        shuffle=True,
        seed=3,
        block_docs=2,
        on_bad_record="skip",
    )
    return ResumableLoader(dataset, batch_size=None, num_workers=workers)


def _through_checkpoint(state: dict) -> dict:
    """The state as Lightning would store it: torch.save, then torch.load(weights_only=True)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _take(iterator, n: int) -> list[torch.Tensor]:
    return [next(iterator)["input_ids"] for _ in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_after_n_batches_gives_identical_batches(enwiki, gpt2, workers):
    loader = _loader(enwiki, gpt2, workers)
    iterator = iter(loader)
    before = _take(iterator, 9)
    state = _through_checkpoint(loader.state_dict())
    after = _take(iterator, 9)
    resumed = _loader(enwiki, gpt2, workers)
    resumed.load_state_dict(state)
    again = _take(iter(resumed), 9)
    assert all(torch.equal(a, b) for a, b in zip(after, again))
    assert not any(torch.equal(before[-1], b) for b in again)  # nothing replayed
    fresh = _take(iter(_loader(enwiki, gpt2, workers)), 18)
    assert all(torch.equal(a, b) for a, b in zip(before + after, fresh))  # deterministic order


def test_state_records_epoch_and_refuses_other_worker_count(enwiki, gpt2):
    loader = _loader(enwiki, gpt2, 0)
    iterator = iter(loader)
    _take(iterator, 16)  # one consumer, ~14 batches per pass over the 6 documents
    state = loader.state_dict()
    assert state["dataset_state"]["epoch"] == 1
    other = _loader(enwiki, gpt2, 2)
    with pytest.raises(LoaderStateError, match="saved with data.num_workers=0, this run has 2"):
        other.load_state_dict(state)


def test_mark_consumed_makes_state_follow_consumption(enwiki, gpt2):
    loader = _loader(enwiki, gpt2, 0)
    iterator = iter(loader)
    first = _take(iterator, 3)
    loader.mark_consumed()
    loader.mark_consumed()  # batch 3 was prefetched but not consumed
    resumed = _loader(enwiki, gpt2, 0)
    resumed.load_state_dict(_through_checkpoint(loader.state_dict()))
    assert torch.equal(next(iter(resumed))["input_ids"], first[2])


def _module_config(enwiki, gpt2_config, workers: int) -> dict:
    return dict(
        source={"kind": "files", "paths": str(enwiki / "enwiki-00009-*.jsonl.gz"), "max_documents": DOCS},
        tokenizer=gpt2_config,
        seq_len=63,
        batch_size=2,
        num_workers=workers,
        val_source=None,
        seed=5,
        block_docs=2,
        on_bad_record="skip",
    )


class _Recorder(L.LightningModule):
    """A tiny model that records the batches its training steps see."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["input_ids"].clone())
        return (self.weight * batch["input_ids"].float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class _IterRecorder(_Recorder):
    """The `dataloader_iter` flavour klalm's LMModule uses: it fetches 2 micro-batches per step itself."""

    def training_step(self, dataloader_iter):
        loss = 0.0
        for _ in range(2):
            batch, _, _ = next(dataloader_iter)
            batch = self.trainer.strategy.batch_to_device(batch)
            loss = loss + super().training_step(batch, 0)
        return loss


def _fit(tmp_path, config: dict, max_steps: int, ckpt_path=None, flavour=_Recorder) -> list[torch.Tensor]:
    model = flavour()
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1, filename="{step}"
    )
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoint],
        limit_val_batches=0,
    )
    trainer.fit(model, datamodule=TextDataModule(**config), ckpt_path=ckpt_path)
    return model.seen


@pytest.mark.parametrize(("workers", "flavour"), [(0, _Recorder), (2, _Recorder), (2, _IterRecorder)])
def test_lightning_resume_sees_exactly_the_same_batches(tmp_path, enwiki, gpt2_config, workers, flavour):
    config = _module_config(enwiki, gpt2_config, workers)
    per_step = 2 if flavour is _IterRecorder else 1
    full = _fit(tmp_path / "full", config, max_steps=6, flavour=flavour)
    resumed = _fit(
        tmp_path / "resumed", config, max_steps=6, ckpt_path=tmp_path / "full" / "step=3.ckpt", flavour=flavour
    )
    assert len(full) == 6 * per_step and len(resumed) == 3 * per_step
    assert all(torch.equal(a, b) for a, b in zip(full[3 * per_step :], resumed))
    saved = torch.load(tmp_path / "full" / "step=3.ckpt", weights_only=False)
    assert saved["TextDataModule"]["train_loader"] == saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]


def test_datamodule_state_round_trips_before_the_loader_exists(enwiki, gpt2_config):
    config = _module_config(enwiki, gpt2_config, 0)
    module = TextDataModule(**config)
    loader = module.train_dataloader()
    iterator = iter(loader)
    _take(iterator, 4)
    state = _through_checkpoint(module.state_dict())
    expected = _take(iterator, 2)
    restored = TextDataModule(**config)
    restored.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(expected, _take(iter(restored.train_dataloader()), 2)))
    with pytest.raises(KeyError, match="train_loader"):
        restored.load_state_dict({})


def test_rank_comes_from_torch_distributed_when_initialised(tmp_path):
    from klalm.data import resolve_rank

    assert resolve_rank(None, None) == (0, 1) and resolve_rank(1, 4) == (1, 4)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert resolve_rank(None, None) == (0, 1)
        with pytest.raises(ValueError, match="torch.distributed says"):
            resolve_rank(1, 2)
    finally:
        torch.distributed.destroy_process_group()


class _RankRecorder(_Recorder):
    def __init__(self, out_dir):
        super().__init__()
        self.out_dir = str(out_dir)

    def on_train_end(self):
        torch.save(self.seen, f"{self.out_dir}/rank{self.global_rank}.pt")


@pytest.mark.slow
def test_ddp_ranks_read_disjoint_data_from_torch_distributed(tmp_path, enwiki, gpt2_config, gpt2):
    """Two CPU processes (gloo): each rank's batches equal those of a dataset built with that rank explicitly."""
    config = _module_config(enwiki, gpt2_config, 0)
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
    )
    trainer.fit(_RankRecorder(tmp_path), datamodule=TextDataModule(**config))
    for rank in range(2):
        seen = torch.load(tmp_path / f"rank{rank}.pt")
        dataset = PackedTextDataset(
            build_source(config["source"]),
            gpt2,
            seq_len=63,
            batch_size=2,
            rank=rank,
            world_size=2,
            seed=5,
            shuffle=True,
            block_docs=2,
            on_bad_record="skip",
        )
        expected = [batch["input_ids"] for batch, _ in zip(dataset, range(3))]
        assert len(seen) == 3 and all(torch.equal(a, b) for a, b in zip(seen, expected))
