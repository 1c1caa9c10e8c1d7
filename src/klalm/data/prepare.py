"""The work of `klalm-prepare-data`: pre-tokenise a data config's splits into memory-mapped token shards.

`prepare_dataset` writes <out>/train, <out>/val (uint16/uint32 shards + index.json, in the layout `klalm.data.shards`
reads) and <out>/tokenizer, which ``KLALM_SHARDS=<out> klalm-train data=shards`` trains from; `prepare_shards` shards
one source. `run` is the command (it also prints a Markdown table of tokens, documents, seconds and tokens/s); its
command line and --help are `klalm.cli.prepare_data_args`, parsed before this module, and torch with it, is imported.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal, NoReturn

import numpy as np
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, InstantiationException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue
from tqdm import tqdm

from klalm.config_checks import SPLIT_KEYS, config_group_options
from klalm.data.records import BadRecordPolicy
from klalm.data.shards import DTYPES, FORMAT, INDEX_FILE
from klalm.data.sources import build_source
from klalm.data.tokenizer import encode_texts, load_tokenizer, same_tokenizer, tokenizer_label, tokenizer_meta
from klalm.errors import in_command_terms, one_line, refuse
from klalm.fileio import NO_LOCKS, flock_path


def choose_dtype(vocab_size: int) -> str:
    """The narrowest supported dtype holding every id of a vocabulary."""
    for name, dtype in DTYPES.items():
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return name
    raise ValueError(f"vocab_size {vocab_size} does not fit in {sorted(DTYPES)}")


class ShardWriter:
    """Appends documents (token lists) to ``tokens-NNNNN.bin`` files of at most ``shard_tokens`` tokens."""

    def __init__(self, out_dir: Path, dtype: str, eos_id: int, shard_tokens: int):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if shard_tokens < 1:  # checked before the folder is made: 0 would open empty shard files forever
            raise ValueError(f"shard_tokens must be > 0, got {shard_tokens}")
        self.out_dir, self.dtype, self.eos_id, self.shard_tokens = out_dir, DTYPES[dtype], eos_id, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.documents = 0
        self.total_tokens = 0
        self._file = None
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, tokens: list[int]) -> None:
        array = np.asarray([*tokens, self.eos_id], dtype=np.int64)
        if array.max(initial=0) > np.iinfo(self.dtype).max:
            raise ValueError(f"token id {array.max()} does not fit in {np.dtype(self.dtype).name}")
        array = array.astype(self.dtype)
        while len(array):
            if self._file is None or self.shards[-1]["tokens"] >= self.shard_tokens:
                self._open_next()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            chunk, array = array[:room], array[room:]
            self._file.write(chunk.astype(np.dtype(self.dtype).newbyteorder("<"), copy=False).tobytes())
            self.shards[-1]["tokens"] += len(chunk)
            self.total_tokens += len(chunk)
        self.documents += 1

    def _open_next(self) -> None:
        if self._file is not None:
            self._file.close()
        name = f"tokens-{len(self.shards):05d}.bin"
        self._file = open(self.out_dir / name, "wb")  # noqa: SIM115 (kept open across add() calls; close() closes)
        self.shards.append({"file": name, "tokens": 0})

    def close(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Closes the last shard and writes ``index.json``; returns the index."""
        if self._file is not None:
            self._file.close()
        index = {
            "format": FORMAT,
            "dtype": np.dtype(self.dtype).name,
            "eos_id": self.eos_id,
            **meta,
            "documents": self.documents,
            "total_tokens": self.total_tokens,
            "shards": self.shards,
        }
        (self.out_dir / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n")
        return index


def prepare_shards(
    source: dict[str, Any],
    tokenizer: dict[str, Any],
    out_dir: str | Path,
    *,
    shard_tokens: int = 100_000_000,
    dtype: str = "auto",
    block_docs: int = 256,
    on_bad_record: Literal["raise", "skip"] = "raise",
    progress: bool = True,
) -> dict[str, Any]:
    """Tokenises a whole source, in order, into token shards with an index (see module docstring).

    Args:
        source: source config (`klalm.data.sources.build_source`), e.g. the enwiki train files.
        tokenizer: tokenizer config (`klalm.data.tokenizer.load_tokenizer`).
        out_dir: output folder (created; an existing index there is overwritten).
        shard_tokens: tokens per shard file.
        dtype: "uint16", "uint32" or "auto" (uint16 when the vocabulary fits).
        block_docs: documents tokenised per batch call.
        on_bad_record: "raise" or "skip" (skips are counted in the index's "skipped").
        progress: show a tqdm bar with tokens/s.

    Returns:
        the index dict, plus "seconds" and "tokens_per_s".

    Raises:
        ValueError: a bad record (on_bad_record="raise"), a file that cannot be read, or no documents at all.
    """
    src, policy, bar = build_source(source), BadRecordPolicy(on_bad_record), str(out_dir) if progress else None
    return _write_shards(source, src, policy, load_tokenizer(tokenizer), out_dir, shard_tokens, dtype, block_docs, bar)


def _write_shards(
    source: dict[str, Any],
    src: Any,
    policy: BadRecordPolicy,
    tok: Any,
    out_dir: str | Path,
    shard_tokens: int,
    dtype: str,
    block_docs: int,
    progress: str | None,
) -> dict[str, Any]:
    """`prepare_shards` from a built source (``src``, from the config ``source``), policy and tokenizer; ``progress``
    is the folder its progress bar names, the one the user asked for (not a staging folder), or None: no bar."""
    if block_docs < 1:
        raise ValueError(f"block_docs must be > 0, got {block_docs}")
    dtype = choose_dtype(len(tok)) if dtype == "auto" else dtype
    writer = ShardWriter(Path(out_dir), dtype, tok.eos_token_id, shard_tokens)
    start = time.perf_counter()
    block: list[str] = []
    # (closed however the loop ends: a Ctrl-C's line then starts a line of its own)
    with tqdm(unit="tok", unit_scale=True, disable=progress is None, desc=f"tokenising -> {progress}") as bar:
        for record in itertools.chain(_read(src), [None]):
            if record is not None and policy.accept(record):
                block.append(record.text)
            if block and (record is None or len(block) == block_docs):
                written = writer.total_tokens
                for ids in encode_texts(tok, block):
                    writer.add(ids)
                block = []
                bar.set_postfix(docs=writer.documents, refresh=False)
                # once per block: tqdm's rate is the tokens since its last print over the time since, and an update
                # per document printed the first one alone over the whole block's time (1.9k tok/s at 170k)
                bar.update(writer.total_tokens - written)
    if writer.documents == 0:
        raise ValueError(f"no documents in {src.describe()} (skipped: {dict(policy.counts) or 'none'})")
    seconds = time.perf_counter() - start
    meta = {**tokenizer_meta(tok), "source": source, "skipped": dict(policy.counts)}
    index = writer.close(meta)
    return {**index, "seconds": seconds, "tokens_per_s": index["total_tokens"] / max(seconds, 1e-9)}


def _read(src: Any) -> Iterator[Any]:
    """The source's records one at a time, as they are tokenised (a split is never held in memory whole); a file that
    cannot be read, found at any record, raises ValueError naming the source."""
    try:
        records = iter(src.stream(0, 1))
        while (record := next(records, None)) is not None:
            yield record
    except (OSError, EOFError, KeyError) as err:  # e.g. a fake or truncated .gz: gzip names neither file nor source
        raise ValueError(f"cannot read {src.describe()}: {one_line(err)}") from err


def plan_dataset(
    data_config: dict[str, Any],
    splits: tuple[str, ...] = ("train", "val"),
    max_documents: int | None = None,
    source_keys: dict[str, str] = SPLIT_KEYS,
) -> dict[str, tuple[dict[str, Any], Any]]:
    """Checks what `prepare_dataset` would read, before anything is written: split -> (source config, source).

    ``source_keys`` names, per split, the key a user sets for its source (``val`` in configs/data/files.yaml), for
    the error about a split without one.

    Raises:
        KeyError: an unknown split, a split whose source the data config lacks, or an unknown source kind.
        ValueError: ``max_documents`` < 1, an unknown ``on_bad_record``, or a split that reads token shards.
        FileNotFoundError: a source path that matches no file.
    """
    if max_documents is not None and max_documents < 1:
        raise ValueError(f"max_documents must be > 0 (None: every record), got {max_documents}")
    BadRecordPolicy(data_config.get("on_bad_record", "raise"))
    plan = {}
    for split in splits:
        if split not in SPLIT_KEYS:
            raise KeyError(f"unknown split {split!r}; valid: {sorted(SPLIT_KEYS)}")
        source = data_config.get(SPLIT_KEYS[split])
        if source is None:
            others = [s for s in splits if s != split]
            hint = f" (or prepare only --splits {' '.join(others)})" if others else ""
            key = source_keys[split]
            raise KeyError(f"split {split!r} has no source: give it one with --override {key}=...{hint}")
        if source.get("kind") == "shards":
            raise ValueError(f"split {split!r} reads token shards ({source.get('path')}), which are prepared already; "
                             "klalm-prepare-data tokenises text sources")  # fmt: skip
        if max_documents is not None:
            source = {**source, "max_documents": max_documents}
        plan[split] = (source, build_source(source))
    return plan


def prepare_dataset(
    data_config: dict[str, Any],
    out_dir: str | Path,
    *,
    splits: tuple[str, ...] = ("train", "val"),
    shard_tokens: int = 100_000_000,
    max_documents: int | None = None,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Shards every split of a data config (``configs/data/*.yaml``) into ``out_dir/<split>``, and saves the
    tokenizer into ``out_dir/tokenizer`` so ``configs/data/shards.yaml`` (KLALM_SHARDS=out_dir) runs from it alone.

    Args:
        data_config: a resolved data config (keys source, val_source, tokenizer, on_bad_record).
        out_dir: output folder.
        splits: which of "train" (``source``) and "val" (``val_source``) to prepare.
        shard_tokens: tokens per shard file.
        max_documents: cap on records per split (for quick runs).
        progress: show progress bars.

    Returns:
        split -> index (with seconds and tokens_per_s).

    Raises:
        what `plan_dataset` raises, and ValueError for ``shard_tokens`` < 1, before anything is written; then what
        `write_dataset` raises.
    """
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be > 0, got {shard_tokens}")
    return write_dataset(plan_dataset(data_config, splits, max_documents), data_config, out_dir, shard_tokens, progress)


def write_dataset(
    plan: dict[str, tuple[dict[str, Any], Any]],
    data_config: dict[str, Any],
    out_dir: str | Path,
    shard_tokens: int,
    progress: bool,
) -> dict[str, dict[str, Any]]:
    """Writes the splits of a `plan_dataset` plan and the tokenizer (see `prepare_dataset`).

    They are written into a temporary folder in ``out_dir`` and moved into place only once all are complete, so a
    failure leaves a previous output whole and no new part (a new ``out_dir`` is removed again, with the folders above
    it that were made for it).

    Raises:
        ValueError: a bad record, an unreadable file or no documents, naming the split; before any is read, a
            ``out_dir/<split>`` or ``out_dir/tokenizer`` it would replace that no earlier run wrote.
        OSError: ``out_dir`` cannot be written.
    """
    out_dir = Path(out_dir)
    # the outermost folder that mkdir makes (out_dir or one above it), or None: a failed run removes what it made
    made = next((p for p in reversed((out_dir, *out_dir.parents)) if not p.exists()), None)
    staging, lock = None, None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        _check_replaceable(out_dir, [*plan, "tokenizer"])
        _remove_stale_staging(out_dir)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out_dir))
        lock = _lock(staging / STAGING_LOCK)
        tok = load_tokenizer(data_config["tokenizer"])
        _check_kept_splits(out_dir, plan, tok)
        results = {}
        for split, (source, src) in plan.items():
            policy = BadRecordPolicy(data_config.get("on_bad_record", "raise"))
            bar = str(out_dir / split) if progress else None  # the user's folder, not the staging one
            try:
                results[split] = _write_shards(
                    source, src, policy, tok, staging / split, shard_tokens, "auto", 256, bar
                )
            except ValueError as err:
                raise ValueError(f"split {split!r}: {err}") from err
        tok.save_pretrained(str(staging / "tokenizer"))
        _swap_in(staging, out_dir, [*results, "tokenizer"])
    except BaseException:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise
    finally:
        if lock is not None:  # closed first: NFS keeps an open file that is removed, and its folder with it
            os.close(lock)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return results


SHARD_FILE = re.compile(r"tokens-\d{5,}\.bin")  # ShardWriter's file names


def _is_shard_file(name: str) -> bool:
    return name == INDEX_FILE or SHARD_FILE.fullmatch(name) is not None


def _check_replaceable(out_dir: Path, names: list[str]) -> None:
    """Refuses to replace what an earlier run did not write: `_swap_in` removes the ``out_dir/<name>`` it replaces,
    which deleted the corpus of ``--out corpus`` where the corpus was ``corpus/train/*.jsonl``. Replaced are a split
    folder holding only ``index.json`` and shard files, and a ``tokenizer`` folder holding ``tokenizer_config.json``.

    Raises:
        ValueError: naming the entry and what in it is not an earlier output's."""
    for name in names:
        path = out_dir / name
        if not path.exists():
            continue
        if not path.is_dir():
            what = "a file"
        elif name == "tokenizer":
            what = None if (path / "tokenizer_config.json").is_file() else "a folder without tokenizer_config.json"
        else:
            foreign = sorted(f.name for f in path.iterdir() if not _is_shard_file(f.name))
            what = f"a folder holding {foreign[0]!r}, not only token shards" if foreign else None
        if what is not None:
            raise ValueError(
                f"{path} is {what}: klalm-prepare-data replaces {name}/ in --out and would delete it; choose another "
                "--out (or move it away)"
            )


def _check_kept_splits(out_dir: Path, plan: dict[str, Any], tok: Any) -> None:
    """Refuses to write some splits beside kept ones of another tokenizer: `--splits train` into a folder whose val/
    was tokenised otherwise replaced train/ and tokenizer/ and left a folder no run could read (`same_tokenizer`).

    Raises:
        ValueError: naming the kept split and both tokenizers."""
    this = tokenizer_meta(tok)
    for split in sorted(set(SPLIT_KEYS) - set(plan)):
        index_file = out_dir / split / INDEX_FILE
        if index_file.is_file():
            try:
                kept = json.loads(index_file.read_text())
                same = same_tokenizer(kept, this)
            except (ValueError, TypeError, AttributeError) as err:  # not UTF-8, not JSON, not an object
                raise ValueError(f"{index_file} is not a shard index ({one_line(err)})") from err
            if not same:
                raise ValueError(
                    f"{out_dir / split} was tokenised with another tokenizer, {tokenizer_label(kept)}, than this "
                    f"one, {tokenizer_label(this)}: write every split again (leave out --splits) or choose another "
                    "--out"
                )


STAGING_PREFIX = ".partial-"  # write_dataset's temporary folder in --out
STAGING_LOCK = ".lock"  # in it: locked (flock) by the run writing it for as long as it runs
STALE_AFTER_S = 60  # a folder younger than this may be one whose run is taking its lock this instant: left alone


def _remove_stale_staging(out_dir: Path) -> None:
    """Removes the temporary folders in ``out_dir`` of runs that were killed (SIGKILL, a lost machine) before they
    could clean up: those whose lock no process holds any more. Left alone: a live run's folder (on this machine, or
    on another sharing a file system whose locks work across machines), one without a lock file or made in the last
    `STALE_AFTER_S` seconds (its run may be starting), and any this process cannot lock (another user's, a file
    system without locks: no way to tell a live run from a dead one)."""
    for folder in out_dir.glob(f"{STAGING_PREFIX}*"):
        try:
            if time.time() - (folder / STAGING_LOCK).stat().st_mtime < STALE_AFTER_S:
                continue
            lock = _lock(folder / STAGING_LOCK)
        except OSError:  # no lock file, another user's folder, its run alive (BlockingIOError), gone meanwhile
            continue
        if lock is None:  # no locks on this file system
            continue
        os.close(lock)  # (closed first, as in write_dataset; a run that takes it now finds its folder gone and fails)
        shutil.rmtree(folder, ignore_errors=True)


def _lock(path: Path) -> int | None:
    """An open descriptor of `path` (created if missing) holding an exclusive flock on it (`flock_path`), or None
    where there are no locks (a file system without them, or Windows); BlockingIOError when another process holds it.
    The lock ends when the descriptor is closed or the process ends, however it ends."""
    try:
        return flock_path(path, os.O_CREAT | os.O_WRONLY)
    except OSError as err:  # BlockingIOError (EAGAIN) is none of NO_LOCKS
        if err.errno in NO_LOCKS:
            return None
        raise


def _swap_in(staging: Path, out_dir: Path, names: list[str]) -> None:
    """Moves each of `names` from `staging` into `out_dir`, the old one aside into `staging` (removed with it); if a
    rename fails or is interrupted, the ones done are undone, so `out_dir` is as it was (no new folder beside old
    ones)."""
    done = []
    try:
        for name in names:
            done.append(name)
            if (out_dir / name).exists():
                (out_dir / name).rename(staging / f"old-{name}")
            (staging / name).rename(out_dir / name)
    except BaseException:
        for name in reversed(done):
            if (out_dir / name).exists() and not (staging / name).exists():  # the new one was moved in: back
                (out_dir / name).rename(staging / name)
            if (staging / f"old-{name}").exists():
                (staging / f"old-{name}").rename(out_dir / name)
        raise


def load_data_config(name: str, overrides: list[str]) -> DictConfig:
    """configs/data/<name>.yaml with Hydra overrides of its keys (unresolved; instantiate it to build the module).

    Raises:
        FileNotFoundError: no such data config (the message lists them).
    """
    names = config_group_options("data")
    if name not in names:
        raise FileNotFoundError(f"--data {name!r}: no configs/data/{name}.yaml; data configs: {names}")
    with initialize_config_dir(config_dir=str(files("klalm.configs").joinpath("data")), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def _fail(message: str) -> NoReturn:
    refuse("klalm-prepare-data", message)


def _unknown_key(name: str, overrides: list[str]) -> str | None:
    """Which override sets a key the data config does not have (None if none does), with the keys it has."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    config = OmegaConf.to_container(load_data_config(name, []), resolve=False)
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_add() or override.is_force_add():
            continue
        node, path = config, []
        for part in override.key_or_group.split("."):
            if not isinstance(node, dict) or part not in node:
                keys = sorted(k for k in node if k != "_target_") if isinstance(node, dict) else []
                where = f"{'.'.join(path)!r} of data config {name!r}" if path else f"data config {name!r}"
                return f"--override {override.input_line}: {where} has no key {part!r}; its keys: {keys}"
            node, path = node[part], [*path, part]
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """`klalm-prepare-data` with its parsed arguments (`klalm.cli.prepare_data_args.parse_args`); returns split ->
    shard index (with seconds and tokens/s).

    Bad input (flags, data config, overrides, missing files or folders) ends it with one line on stderr before
    anything is written to ``--out``; bad data found while writing (a bad record, an unreadable file, an empty split)
    ends it the same way and leaves ``--out`` as it was. Ctrl-C ends it with one line saying what ``--out`` holds
    and exit status 130: as it was (a new ``--out`` not created), unless the splits had been moved in already.
    """
    try:
        existed, tokenizer = args.out.exists(), _folder_id(args.out / "tokenizer")
    except OSError as err:  # e.g. --out under a folder that cannot be read
        _fail(f"--out {args.out}: {one_line(err)}")
    try:
        results = _prepare(args)
    except KeyboardInterrupt:
        if _folder_id(args.out / "tokenizer") != tokenizer:  # moved in last: only the clean-up after was cut short
            kept = f"{args.out} holds the new splits already"
        elif existed:
            kept = f"nothing written, {args.out} is as it was"
        else:
            kept = f"nothing written, {args.out} not created"
        refuse("klalm-prepare-data", f"interrupted; {kept}", status=130)
    print("| split | documents | tokens | shards | dtype | skipped | seconds | tokens/s |")
    print("| --- | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    for split, r in results.items():
        print(
            f"| {split} | {r['documents']:,} | {r['total_tokens']:,} | {len(r['shards'])} | {r['dtype']} | "
            f"{r['skipped'] or '-'} | {r['seconds']:.1f} | {r['tokens_per_s']:,.0f} |"
        )
    return results


def _folder_id(path: Path) -> int | None:
    """A folder's inode (None: none there): `_swap_in` moves a new folder in, so a changed one was written."""
    return path.stat().st_ino if path.exists() else None


def _prepare(args: argparse.Namespace) -> dict[str, Any]:
    """`run`'s work: checks, then writes (refusing bad input and bad data with one line)."""
    import hydra

    try:
        config = load_data_config(args.data, args.override)
    except FileNotFoundError as err:  # no such data config (the message lists them)
        _fail(str(err))
    except OverrideParseException as err:
        _fail(f"--override: {err}")
    except ConfigCompositionException as err:
        _fail(_unknown_key(args.data, args.override) or f"--override: {err}")
    try:
        datamodule = hydra.utils.instantiate(config)
    except MissingMandatoryValue as err:
        _fail(f"--data {args.data}: {err.full_key} has no value; set it with --override {err.full_key}=...")
    except InstantiationException as err:
        # the data module's own checks: a missing data folder, data file or tokenizer, a bad value; a key the data
        # module does not take (added with --override +key=...)
        cause = err.__cause__
        unknown = isinstance(cause, TypeError) and "unexpected keyword argument" in str(cause)
        if not (unknown or isinstance(cause, (OSError, KeyError, ValueError))):
            raise
        _fail(f"--data {args.data}: {one_line(cause)}")
    data_config = datamodule.sources()
    keys = {split: key if key in config else split for split, key in SPLIT_KEYS.items()}  # files.yaml: train, val
    try:
        plan = plan_dataset(data_config, tuple(args.splits), args.max_documents, keys)
    except (KeyError, ValueError, FileNotFoundError) as err:
        _fail(f"--data {args.data}: {one_line(err)}")
    try:
        return write_dataset(plan, data_config, args.out, args.shard_tokens, not args.no_progress)
    except (ValueError, OSError) as err:  # a bad record's hint names the --override that skips such records
        _fail(f"--data {args.data}: {in_command_terms(one_line(err), '--override on_bad_record=skip')}")
