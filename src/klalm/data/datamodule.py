"""`TextDataModule`: the Lightning face of the pipeline, built by Hydra from ``configs/data/<name>.yaml``.

The tokenizer is loaded in ``__init__`` so the model can read ``len(dm.tokenizer)`` before it is built.
``train_dataloader()`` returns a `ResumableLoader` (a torchdata `StatefulDataLoader`): Lightning saves its state
in checkpoints by itself, and this module also returns it from ``state_dict()``; the state follows the batches
that actually reached ``training_step`` (see `klalm.data.loader`), so a resumed run sees exactly the tokens it
would have seen. Validation reads ``val_batches`` batches per rank from the start of the validation source
every time (wrapping around if the source is shorter), so every rank runs the same number of steps.
"""

from __future__ import annotations

import functools
import logging
import signal
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch.utils.data import DataLoader

from klalm.config_checks import ConfigError
from klalm.data.loader import NoDocumentsError, ResumableLoader, resolve_pin_memory
from klalm.data.packing import PackedTextDataset
from klalm.data.records import expand_paths
from klalm.data.shards import ShardDataset, ShardSource
from klalm.data.sources import HFSource, build_source
from klalm.data.tokenizer import load_tokenizer, named_tokenizer, same_tokenizer, tokenizer_label, tokenizer_meta

log = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    """OmegaConf containers (from Hydra) to plain dicts/lists, resolving interpolations."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def ignore_ctrl_c(worker_id: int) -> None:
    """A loader worker's start: ignore SIGINT, which a terminal's Ctrl-C sends to every process of the job, so that
    the workers live on while the training process saves its checkpoint and stops (klalm.train.checkpoint); they
    end with the loader, as always."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size) from torch.distributed when initialised, else the given values (default 0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        actual = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if (rank is not None and rank != actual[0]) or (world_size is not None and world_size != actual[1]):
            raise ValueError(f"rank/world_size given as {rank}/{world_size} but torch.distributed says {actual}")
        return actual
    return (rank or 0), (world_size or 1)


def _packed_dataset(source: Any, data: TextDataModule, **common: Any) -> Any:
    return PackedTextDataset(
        source, data.tokenizer, on_bad_record=data.on_bad_record, block_docs=data.block_docs, **common
    )


def _shard_dataset(source: Any, data: TextDataModule, **common: Any) -> Any:
    """Refuses shards of another tokenizer than the data module's (`same_tokenizer`: by hash, an older index by
    vocabulary size)."""
    index, this = source.shards.index, data.tokenizer_meta
    if not same_tokenizer(index, this):
        raise ConfigError(
            f"shards {source.shards.path} were tokenised with another tokenizer, {tokenizer_label(index)}, than the "
            f"tokenizer config's, {tokenizer_label(this)}: train with the tokenizer they were prepared with (the "
            "tokenizer/ folder klalm-prepare-data wrote beside them) or prepare them again"
        )
    return ShardDataset(source, **common)


DATASETS = {"files": _packed_dataset, "hf": _packed_dataset, "python_docs": _packed_dataset, "shards": _shard_dataset}


class TextDataModule(L.LightningDataModule):
    """Streaming, packed, resumable LM data.

    Args:
        source: training source config, ``{"kind": "files"|"hf"|"python_docs"|"shards", ...}``.
        tokenizer: tokenizer config, ``{"kind": "hf"|"trained_bpe", ...}``.
        seq_len: T, tokens per example.
        batch_size: B, examples per batch per device (micro batch).
        num_workers: DataLoader worker processes per rank (0: tokenise in the main process).
        val_source: validation source config (None: no validation).
        val_batches: validation batches per rank (None: one full pass; single process only).
        val_batch_size: validation B (default: batch_size).
        seed: seed of the shuffles.
        shuffle: block-shuffle documents (document sources) or permute windows (shards) in training.
        block_docs: documents read and tokenised at a time (and the shuffle span).
        on_bad_record: "raise" or "skip" (counted) for corrupt/empty/undecodable records.
        rank, world_size: for use without torch.distributed (taken from it when initialised).
        pin_memory: pin batches, so that moving them to the GPU neither waits for the GPU's queued work nor
            stalls the host (None: pin when CUDA is available).
        data_root: folder the config's paths are interpolated from (``${..data_root}``); checked to exist, so a
            missing ../shared/data fails at once with its name.

    Shapes:
        batches are {"input_ids": LongTensor[B, T], "labels": LongTensor[B, T]}.
    """

    def __init__(
        self,
        source: dict,
        tokenizer: dict,
        seq_len: int,
        batch_size: int,
        num_workers: int = 0,
        val_source: dict | None = None,
        val_batches: int | None = 8,
        val_batch_size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        block_docs: int = 64,
        on_bad_record: Literal["raise", "skip"] = "raise",
        rank: int | None = None,
        world_size: int | None = None,
        pin_memory: bool | None = None,
        data_root: str | None = None,
    ):
        super().__init__()
        if data_root is not None and not Path(data_root).expanduser().is_dir():
            raise FileNotFoundError(
                f"data_root {data_root} ({Path(data_root).expanduser().resolve()}) does not exist: set "
                "KLALM_SHARED_DATA to the shared data folder, or use the python_docs data config offline"
            )
        self.source_config, self.val_source_config = _plain(source), _plain(val_source)
        for name, config in {"source": self.source_config, "val_source": self.val_source_config}.items():
            if config is not None and config.get("kind") not in DATASETS:
                raise KeyError(f"{name}.kind must be one of {sorted(DATASETS)}, got {config.get('kind')!r}")
        if val_batches is not None and val_batches < 1:
            raise ValueError(f"val_batches must be >= 1 or None, got {val_batches}")
        self.tokenizer_config = _plain(tokenizer)
        self.tokenizer = load_tokenizer(self.tokenizer_config)
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self.val_batches, self.val_batch_size = val_batches, val_batch_size or batch_size
        self.seed, self.shuffle, self.block_docs, self.on_bad_record = seed, shuffle, block_docs, on_bad_record
        self.rank, self.world_size, self.pin_memory = rank, world_size, resolve_pin_memory(pin_memory)
        self._train_loader: ResumableLoader | None = None
        self._pending_state: dict[str, Any] | None = None

    @functools.cached_property
    def tokenizer_meta(self) -> dict[str, Any]:
        """The tokenizer's `tokenizer_meta`, which shards are checked against, computed when first asked for: once
        for the training and the validation shards (hashing GPT-2's definition takes about half a second)."""
        return tokenizer_meta(self.tokenizer)

    def sources(self) -> dict[str, Any]:
        """The plain configs this module reads: source, val_source, tokenizer, on_bad_record (what
        `klalm.data.prepare.prepare_dataset` takes)."""
        return {
            "source": self.source_config,
            "val_source": self.val_source_config,
            "tokenizer": self.tokenizer_config,
            "on_bad_record": self.on_bad_record,
        }

    def _dataset(self, config: dict, train: bool) -> Any:
        rank, world_size = resolve_rank(self.rank, self.world_size)
        if not train and self.val_batches is None and world_size > 1:
            raise ValueError("val_batches=None (one full pass) gives ranks unequal batch counts; set val_batches")
        config = dict(config)
        kind = config["kind"]
        return DATASETS[kind](
            build_source(config),
            self,
            seq_len=self.seq_len,
            batch_size=self.batch_size if train else self.val_batch_size,
            rank=rank,
            world_size=world_size,
            seed=self.seed,
            shuffle=self.shuffle and train,
            loop=train or self.val_batches is not None,
            num_batches=None if train else self.val_batches,
        )

    def setup(self, stage: str) -> None:
        """Lightning's hook before fitting, on every rank (distributed set up): a validation source that would give
        some consumer (rank x loader worker) no batch is refused now (`check_validation_source`), not at the first
        validation, which a run without sanity validation (the CPU trainer config) reaches only after
        ``train.val_every_n_steps`` steps. A run that never validates (`trainer.limit_val_batches=0`: Lightning never
        asks for the loader) is not checked."""
        never_validates = self.trainer is not None and self.trainer.limit_val_batches == 0
        if stage == "fit" and self.val_source_config is not None and not never_validates:
            _, world_size = resolve_rank(self.rank, self.world_size)
            workers = max(self.num_workers, 1)
            givers = min(workers, self.val_batches or workers)  # the first workers of a rank: the others get no batch
            check_validation_source(
                build_source(self.val_source_config),
                world_size * workers,
                {rank * workers + worker for rank in range(world_size) for worker in range(givers)},
                seq_len=self.seq_len,
                batch_size=self.val_batch_size,
            )

    def train_dataloader(self) -> ResumableLoader:
        """The training stream (unbounded; train by steps). Restores a state loaded before it was created."""
        loader = ResumableLoader(
            self._dataset(self.source_config, train=True),
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            worker_init_fn=ignore_ctrl_c,
        )
        if self._pending_state is not None:
            loader.load_state_dict(self._pending_state)
            self._pending_state = None
        self._train_loader = loader
        return loader

    def val_dataloader(self) -> DataLoader | list:
        """``val_batches`` batches per rank from the start of the validation source ([] without one)."""
        if self.val_source_config is None:
            return []
        return DataLoader(
            self._dataset(self.val_source_config, train=False),
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            worker_init_fn=ignore_ctrl_c,
        )

    def skipped_records(self) -> dict[str, int]:
        """Bad records skipped so far by the training stream, summed over workers, per reason."""
        state = self.state_dict()["train_loader"] or {}
        workers = state["_snapshot"]["_worker_snapshots"].values() if "_snapshot" in state else [state]
        counts: dict[str, int] = {}
        for worker in workers:
            for reason, count in (worker.get("dataset_state") or {}).get("bad", {}).items():
                counts[reason] = counts.get(reason, 0) + count
        return counts

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Counts training batches that reached a step, so the saved loader state skips no prefetched batch."""
        trainer = self.trainer
        if trainer is not None and trainer.training and self._train_loader is not None:
            self._train_loader.mark_consumed()
        return batch

    def state_dict(self) -> dict[str, Any]:
        """{"train_loader": state of the training loader} (after the last consumed batch)."""
        if self._train_loader is not None:
            return {"train_loader": self._train_loader.state_dict()}
        return {"train_loader": self._pending_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the training position; applied now or when ``train_dataloader()`` is next called."""
        if "train_loader" not in state_dict:
            raise KeyError(f"data module state lacks 'train_loader' (keys: {sorted(state_dict)})")
        state = state_dict["train_loader"]
        if self._train_loader is not None and state is not None:
            self._train_loader.load_state_dict(state)
        else:
            self._pending_state = state


def check_validation_source(source: Any, consumers: int, reading: set[int], *, seq_len: int, batch_size: int) -> None:
    """Refuses a validation source from which a consumer would get no batch, as its dataset would at the first
    validation: token shards with fewer windows of ``seq_len + 1`` tokens per consumer than one batch (each of the
    ``consumers`` gets at least ``windows // consumers``), or a local document source (files, python_docs) that gives
    one of the consumers that read (``reading``: those with a batch to give) no usable document; it is read until each
    has one, so a good source costs a few records. A `kind: hf` source (a hub stream, or the datasets library's
    builders over local files) is not read ahead.

    Raises:
        NoDocumentsError: naming the source (its files or folder)."""
    if isinstance(source, ShardSource):
        windows = len(source.shards) // (seq_len + 1)
        if windows // consumers < batch_size:
            raise NoDocumentsError(
                f"validation source {source.describe()}: {windows} windows of {seq_len + 1} tokens leave some of its "
                f"{consumers} consumers (ranks x loader workers) {windows // consumers}, fewer than one batch of "
                f"{batch_size}"
            )
    elif not isinstance(source, HFSource):
        waiting = set(reading)
        for index, record in enumerate(source.stream(0, 1)):  # record `index` goes to consumer index % consumers
            if record.problem is None:
                waiting.discard(index % consumers)
                if not waiting:
                    return
        raise NoDocumentsError(
            f"validation source {source.describe()} gives consumer {min(waiting)} of {consumers} (ranks x loader "
            "workers) no usable document: it holds fewer than the consumers, or none"
        )


def files_source(paths: str | list[str], field: str = "text") -> dict[str, Any]:
    """The source config of local files (`klalm.data.sources.build_source`): a path, a glob or a list of them, and
    the text field of their records."""
    return {"kind": "files", "paths": _plain(paths), "field": field}


def local_files(
    train: str | list[str],
    val: str | list[str] | None = None,
    tokenizer: str = "gpt2",
    *,
    field: str = "text",
    bpe_vocab_size: int = 4096,
    cache_dir: str = "~/.cache/klalm",
    **options: Any,
) -> TextDataModule:
    """A `TextDataModule` over local files, in the terms of ``configs/data/files.yaml`` (``data=files``).

    Args:
        train: training files: a path, a glob or a list of them (jsonl, json, parquet, txt; also .gz, .bz2, .zst).
        val: validation files, in the same forms; None: no validation.
        tokenizer: "bpe" (a byte-level BPE trained once on the training files, cached), a hub name such as "gpt2",
            or the folder of a Hugging Face tokenizer (see `klalm.data.tokenizer.named_tokenizer`).
        field: the text field of jsonl/json records and parquet rows (txt files are one document each).
        bpe_vocab_size: vocabulary of the trained BPE (tokenizer="bpe" only).
        cache_dir: where the trained BPE is cached (tokenizer="bpe" only).
        **options: the other `TextDataModule` arguments (seq_len, batch_size, num_workers, ...).

    Raises:
        FileNotFoundError: a train or val pattern that matches no file (named before any tokenizer work: a hub
            tokenizer offline would otherwise retry the network first).
    """
    source = files_source(train, field)
    val_source = None if val is None else files_source(val, field)
    for paths in (train, val):  # a missing file is named before the tokenizer is fetched or trained
        if paths is not None:
            expand_paths(_plain(paths))
    tokenizer_config = named_tokenizer(tokenizer, source, bpe_vocab_size=bpe_vocab_size, cache_dir=cache_dir)
    return TextDataModule(source=source, val_source=val_source, tokenizer=tokenizer_config, **options)
