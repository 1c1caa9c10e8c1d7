"""Document sources: where text comes from, partitioned across consumers without overlap or loss.

A *consumer* is one DataLoader worker of one rank: consumer ``c = rank * num_workers + worker_id`` of
``N = world_size * num_workers``. Every source gives each consumer a disjoint share of its records whose union is
the whole source, and a resumable position (`DocumentStream.state_dict`).

Registry (``kind`` key of a source config):
- ``files``: local jsonl/json/parquet/txt (also .gz/.bz2/.zst), glob patterns; record ``r`` goes to consumer
  ``r % N``.
- ``hf``: Hugging Face ``datasets`` streaming (hub or a local builder such as ``json``); split across consumers
  by data file when there are at least N files, else every N-th example; resumed through
  the ``datasets`` iterable state dict.
- ``python_docs``: the offline corpus (Python language reference + standard-library docstrings).
- ``shards``: pre-tokenised memory-mapped token shards (see `klalm.data.shards`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from klalm.data.hub import check_hub
from klalm.data.records import Record, expand_paths, iter_raw_records
from klalm.data.shards import ShardSource

log = logging.getLogger(__name__)


class DocumentStream(Protocol):
    """One consumer's pass over a source: iterates `Record`s; ``state_dict()`` is the position after the last."""

    def __iter__(self) -> Iterator[Record]: ...

    def state_dict(self) -> dict[str, Any]: ...


class _StridedStream:
    """Takes records ``r`` with ``r % N == c`` from a globally numbered record sequence, from a saved position."""

    def __init__(
        self,
        raw: Iterable[tuple[str, Any]],
        consumer: int,
        num_consumers: int,
        state: dict | None,
        max_documents: int | None,
    ):
        self._raw = raw
        self._consumer = consumer
        self._num = num_consumers
        self._limit = max_documents
        self._next = int(state["record"]) if state else 0  # global index of the first record still to consider

    def __iter__(self) -> Iterator[Record]:
        for index, (_, decode) in enumerate(self._raw):
            if self._limit is not None and index >= self._limit:
                return
            if index < self._next or index % self._num != self._consumer:
                continue
            self._next = index + 1
            yield decode()

    def state_dict(self) -> dict[str, Any]:
        return {"record": self._next}


class FileSource:
    """Local files (jsonl / json / parquet / txt, optionally .gz / .bz2 / .zst) named by glob patterns.

    Args:
        paths: a glob pattern or a list of them; each must match at least one file.
        field: name of the text field (jsonl/json keys, parquet column; ignored for txt: one file = one document).
        max_documents: read only the first this-many records (global, before partitioning), e.g. for tests.
    """

    def __init__(self, paths: str | list[str], field: str = "text", max_documents: int | None = None):
        self.files = expand_paths(paths)
        self.field = field
        self.max_documents = max_documents

    def _raw(self) -> Iterator[tuple[str, Any]]:
        for path in self.files:
            yield from iter_raw_records(path, self.field)

    def stream(self, consumer: int, num_consumers: int, state: dict | None = None) -> DocumentStream:
        """This consumer's share of the records, starting after position ``state``."""
        return _StridedStream(self._raw(), consumer, num_consumers, state, self.max_documents)

    def describe(self) -> str:
        return f"files {[str(p) for p in self.files]} field={self.field!r}"


class _HFStream:
    def __init__(self, dataset: Any, where: str, field: str, state: dict | None):
        self._dataset = dataset
        self._where = where
        self._field = field
        self._seen = 0
        if state:
            self._dataset.load_state_dict(state["hf"])
            self._seen = int(state["seen"])

    def __iter__(self) -> Iterator[Record]:
        # `.iter()` rather than `iter()`: inside a DataLoader worker, `datasets` would otherwise split the stream
        # across workers a second time (we already gave this consumer its own share).
        for batch in self._dataset.iter(batch_size=1):
            self._seen += 1
            where = f"{self._where} example {self._seen}"
            if self._field not in batch:
                yield Record(None, where, "missing_field", f"no field {self._field!r} (fields: {sorted(batch)})")
                continue
            value = batch[self._field][0]
            if not isinstance(value, str):
                yield Record(None, where, "not_text", f"field {self._field!r} holds {type(value).__name__}")
            elif not value.strip():
                yield Record(None, where, "empty_document", f"field {self._field!r} is empty or whitespace")
            else:
                yield Record(value, where)

    def state_dict(self) -> dict[str, Any]:
        return {"hf": self._dataset.state_dict(), "seen": self._seen}


def _is_hub_dataset(path: str) -> bool:
    """Whether `datasets.load_dataset(path)` reads a hub dataset: not one of its packaged builders (json, parquet,
    ...), not a local folder, and "name" or "org/name" (as `datasets` tells them apart), or an `hf://` path."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    if path.startswith("hf://"):
        return True
    if path in _PACKAGED_DATASETS_MODULES or Path(path).expanduser().is_dir():
        return False
    return not path.startswith((".", "/", "~")) and path.count("/") <= 1


class HFSource:
    """A Hugging Face ``datasets`` stream: a hub dataset (needs network) or a local builder such as ``json``.

    A stream of a hub dataset is refused at once, before `datasets` asks the hub, when the hub cannot be reached
    (`klalm.data.hub`); building the source asks nothing.

    Partitioning across the N consumers (both modes are disjoint and exhaustive):
    1. with at least N data files, the files are split into N contiguous groups: each consumer downloads only
       its own files;
    2. otherwise every consumer reads the whole stream and keeps every N-th example (logged as a warning: N times
       the download; use more data files or fewer ranks x workers). ``datasets`` 4.8's ``reshard()`` does not
       split parquet files into row groups for builder-made streams (its split kwargs hold ``[None]`` row-group
       lists), so files are the unit;
    3. with ``max_documents`` the cap is global, so mode 2 is used.

    Args:
        path: dataset name on the hub (e.g. ``HuggingFaceFW/fineweb-edu``) or a builder (``json``, ``parquet``).
        name: dataset config (e.g. ``sample-10BT``).
        split: split name.
        field: text field.
        data_files: files for local builders or a subset of a hub dataset's files (glob patterns allowed).
        revision: hub revision (branch, tag or commit) for reproducible runs.
        max_documents: read only the first this-many examples (before partitioning).
    """

    def __init__(
        self,
        path: str,
        name: str | None = None,
        split: str = "train",
        field: str = "text",
        data_files: Any = None,
        revision: str | None = None,
        max_documents: int | None = None,
    ):
        self.path, self.name, self.split, self.field = path, name, split, field
        self.data_files, self.revision, self.max_documents = data_files, revision, max_documents

    def stream(self, consumer: int, num_consumers: int, state: dict | None = None) -> DocumentStream:
        """This consumer's share of the examples (see the class docstring), resumed from ``state``."""
        import datasets
        from datasets.distributed import split_dataset_by_node

        if _is_hub_dataset(self.path):  # before `datasets` retries each file; in a worker, re-raised as it is
            check_hub(
                f"streaming the hub dataset {self.path!r}",
                "use local files (data=files, or kind: hf with a local builder such as json and data_files)",
                streaming=True,
            )
        dataset = datasets.load_dataset(
            self.path, self.name, split=self.split, streaming=True, data_files=self.data_files, revision=self.revision
        )
        if self.max_documents is not None:
            dataset = split_dataset_by_node(dataset.take(self.max_documents), rank=consumer, world_size=num_consumers)
        else:
            if dataset.num_shards >= num_consumers:
                dataset = dataset.shard(num_shards=num_consumers, index=consumer, contiguous=True)
            else:
                if consumer == 0:
                    log.warning(
                        "%s has %d data sources for %d consumers (ranks x workers): every consumer streams all of "
                        "it and keeps every %d-th example",
                        self.describe(), dataset.num_shards, num_consumers, num_consumers,
                    )  # fmt: skip
                dataset = split_dataset_by_node(dataset, rank=consumer, world_size=num_consumers)
        where = f"{self.path}[{self.name or ''}:{self.split}] consumer {consumer}/{num_consumers}"
        return _HFStream(dataset, where, self.field, state)

    def describe(self) -> str:
        return f"hf {self.path} name={self.name} split={self.split} field={self.field!r}"


class PythonDocsSource:
    """The offline corpus: Python language reference (`pydoc_data.topics`) + stdlib docstrings (PSF licence).

    Args:
        split: "train" or "val" (a deterministic hash hold-out of ``val_percent`` % of the documents).
        cache_dir: where the extracted corpus (jsonl, one document per line) is cached.
        val_percent: percentage of documents held out for validation.
        max_documents: read only the first this-many documents of the split.
    """

    def __init__(
        self,
        split: str = "train",
        cache_dir: str = "~/.cache/klalm",
        val_percent: int = 5,
        max_documents: int | None = None,
    ):
        from klalm.data.python_docs import python_docs_corpus

        self.split = split
        self.documents = python_docs_corpus(Path(cache_dir), split=split, val_percent=val_percent)
        self.max_documents = max_documents

    def _raw(self) -> Iterator[tuple[str, Any]]:
        for doc in self.documents:
            where = f"python_docs:{doc['id']}"
            yield where, (lambda doc=doc, where=where: Record(doc["text"], where))

    def stream(self, consumer: int, num_consumers: int, state: dict | None = None) -> DocumentStream:
        """This consumer's share of the documents, starting after position ``state``."""
        return _StridedStream(self._raw(), consumer, num_consumers, state, self.max_documents)

    def describe(self) -> str:
        return f"python_docs split={self.split} ({len(self.documents)} documents)"


SOURCES: dict[str, Any] = {
    "files": FileSource,
    "hf": HFSource,
    "python_docs": PythonDocsSource,
    "shards": ShardSource,
}


def build_source(config: dict[str, Any]) -> Any:
    """Builds a source from its config: ``{"kind": <one of SOURCES>, **arguments}``.

    Raises:
        KeyError: missing or unknown ``kind`` (listing the valid ones).
    """
    config = dict(config)
    if "kind" not in config:
        raise KeyError(f"source config needs a 'kind' key, one of {sorted(SOURCES)}; got keys {sorted(config)}")
    kind = config.pop("kind")
    if kind not in SOURCES:
        raise KeyError(f"unknown source kind {kind!r}; valid kinds: {sorted(SOURCES)}")
    return SOURCES[kind](**config)
