"""A StatefulDataLoader whose state can lag behind what it has yielded, to match what training has consumed.

torchdata's `StatefulDataLoader.state_dict()` describes the position after the last batch *yielded*. Lightning's
fit loop prefetches one batch ahead (`_PrefetchDataFetcher`), so when a checkpoint is written after training step
n, the loader has already yielded batch n + 1, and a run resumed from that state would skip it. This loader keeps
the state snapshot taken after each yielded batch (a few of them) and, once a consumer reports consumption through
`mark_consumed()` (`TextDataModule` does so from Lightning's ``on_after_batch_transfer`` hook, which runs only for
batches that reach a training step), `state_dict()` returns the snapshot of the last *consumed* batch. Without
`mark_consumed` calls it behaves exactly like `StatefulDataLoader`.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

# torchdata 0.11's StatefulDataLoader calls torch.set_vital, which torch ≥ 2.10 deprecates, on every construction.
warnings.filterwarnings("ignore", message=r"'set_vital' is deprecated", category=UserWarning)

MAX_LAG_BATCHES = 8  # snapshots kept: consumption may trail yielding by at most this many batches


class NoDocumentsError(ValueError):
    """A whole pass over the source gave a consumer no usable document: an empty file, every record bad, fewer
    documents than ranks x workers, or from shards fewer windows than one batch (`klalm-train` refuses it in one
    line)."""


class LoaderStateError(ValueError):
    """A saved loader position this run cannot take up: saved with another `data.num_workers`, or by another number
    of ranks where the data cannot be re-split (`klalm-train` refuses it in one line)."""


def resolve_pin_memory(pin_memory: bool | None) -> bool:
    """A data module's `pin_memory` setting: None pins when CUDA is available. A pinned batch moves to the GPU
    asynchronously (Lightning copies with non_blocking=True); a pageable one is staged through the driver, and the
    copy can wait for the work already queued on the GPU before the host may go on to launch the next step."""
    return torch.cuda.is_available() if pin_memory is None else pin_memory


def consumer_split(rank: int, world_size: int, num_batches: int | None) -> tuple[int, int, int | None]:
    """(consumer index, number of consumers, this consumer's batch quota) for the calling DataLoader worker.

    A rank's ``num_batches`` is spread over its workers (the first ``num_batches % workers`` get one more), so
    every rank yields exactly ``num_batches`` batches, which keeps distributed validation in lock-step.
    """
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    quota = None
    if num_batches is not None:
        quota = num_batches // workers + int(worker < num_batches % workers)
    return rank * workers + worker, world_size * workers, quota


def windows_to_batch(windows: list[list[int]] | torch.Tensor) -> dict[str, torch.Tensor]:
    """Packs B windows of T+1 tokens (lists, or an int64 tensor [B, T+1]) into {"input_ids", "labels"} [B, T]."""
    w = torch.as_tensor(windows, dtype=torch.long)  # [B, T+1]
    return {"input_ids": w[:, :-1].contiguous(), "labels": w[:, 1:].contiguous()}  # [B, T] each


class ResumableLoader(StatefulDataLoader):
    """`StatefulDataLoader` + consumption tracking (see module docstring). Same constructor arguments."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._snapshots: deque[tuple[int, dict[str, Any]]] = deque(maxlen=MAX_LAG_BATCHES + 1)
        self._yielded = 0
        self._consumed = 0
        self._tracking = False

    def __iter__(self) -> Iterator[Any]:
        start = super().state_dict()  # the loaded state if one is pending, else the fresh state
        iterator = super().__iter__()
        self._snapshots.clear()
        self._snapshots.append((0, start))
        self._yielded = self._consumed = 0
        return self._track(iterator)

    def _track(self, iterator: Iterator[Any]) -> Iterator[Any]:
        for batch in iterator:
            self._yielded += 1
            self._snapshots.append((self._yielded, super().state_dict()))
            yield batch

    def mark_consumed(self) -> None:
        """Records that one more yielded batch reached training; `state_dict` then follows consumption."""
        if self._consumed >= self._yielded:
            raise RuntimeError(
                f"mark_consumed called {self._consumed + 1} times but only {self._yielded} batches were yielded"
            )
        self._consumed += 1
        self._tracking = True

    def state_dict(self) -> dict[str, Any]:
        """State after the last consumed batch when consumption is tracked, else after the last yielded one."""
        if not self._tracking or not self._snapshots:
            return super().state_dict()
        for count, snapshot in self._snapshots:
            if count == self._consumed:
                return snapshot
        raise RuntimeError(
            f"no loader snapshot for consumed batch {self._consumed} (yielded {self._yielded}); "
            f"consumption trails yielding by more than {MAX_LAG_BATCHES} batches"
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a saved position; the state must come from a loader with the same ``num_workers``."""
        if state_dict:
            saved = len(state_dict["_snapshot"]["_worker_snapshots"]) if "_snapshot" in state_dict else 0
            if saved != self.num_workers:
                raise LoaderStateError(
                    f"the checkpoint's data position was saved with data.num_workers={saved}, this run has "
                    f"{self.num_workers}: resume with data.num_workers={saved}"
                )
        self._snapshots.clear()
        self._yielded = self._consumed = 0
        self._tracking = False
        super().load_state_dict(state_dict)
