"""Hugging Face exports: write a model (and its tokenizer) as a folder that loads anywhere, and check one before use.

An export is `save_pretrained` output (safetensors) plus:
- `auto_map` in config.json and the model code beside it (config.py, hf.py: klalm/models/__init__.py registers both
  classes for their Auto class), so `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` and
  `lm-eval --model hf --model_args pretrained=dir,trust_remote_code=True` work in a Python that never imports klalm
  itself (the copied code imports klalm, which must be installed, as fla's exports need fla);
- the tokenizer's EOS / BOS / padding ids in config.json and generation_config.json (padding = EOS when the tokenizer
  has no padding token), and `model_max_length` = the context the model was trained on in the tokenizer files;
- `source.json`, where the caller says which optimiser step the weights are from (`klalm-train` does): a run folder
  whose checkpoints go beyond it holds a stale export (`klalm.models.checkpoint.check_export_current`);
- `SHA256SUMS`: the sha256 of every other file, written last (`sha256sum -c SHA256SUMS` checks it too).
  `verify_export` recomputes it; `klalm-eval` and `klalm.models.checkpoint.load_model` refuse an export whose files
  changed since, or that holds an unlisted file its load may read (a leftover of another export).

The folder is written beside its target and renamed into place, so a failed export leaves nothing behind, and one
killed between setting the earlier export aside and renaming the new one is mended by the next export (the new one
put in place if complete, else the earlier one back). The target may be new, empty, or an earlier export (the files
its SHA256SUMS lists, or a klalm export made without one), which is then replaced as a whole; a folder holding
anything else is refused (`ExportTargetError`), and nothing in it is changed.

`load_export_model` is the strict way back: it verifies SHA256SUMS, then refuses weights that do not fit the folder's
config.json (a missing, unexpected or differently shaped tensor, e.g. a config edited to another arch), which
`from_pretrained` would otherwise fill with random values after a warning.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import glob
import hashlib
import importlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from klalm.errors import one_line
from klalm.models.config import KLALMConfig

log = logging.getLogger(__name__)

MANIFEST = "SHA256SUMS"
SOURCE = "source.json"  # {"step": N}: the optimiser step the exported weights are from
_CHUNK_BYTES = 1 << 20


class ExportIntegrityError(ValueError):
    """An export's file does not match its SHA256SUMS entry (or is missing), or its weights do not fit its config;
    the message names the file."""


class ExportTargetError(ValueError):
    """The folder an export was to be written to is a file, or holds files that are not an earlier export."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: str | Path) -> Path:
    """Writes `<folder>/SHA256SUMS` (`<hex>  <relative path>` per file, sorted) over every file but itself."""
    folder = Path(folder)
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    lines = [f"{sha256_file(folder / name)}  {name}\n" for name in names]
    path = folder / MANIFEST
    path.write_text("".join(lines), encoding="utf-8")
    return path


def verify_export(folder: str | Path) -> bool:
    """Checks every file listed in `<folder>/SHA256SUMS` against its sha256, and that no unlisted file is one that a
    load may read (`LOADED_FILE_PATTERNS`): e.g. a model.safetensors copied beside a sharded export, which
    transformers loads before the listed shards. Other files (a README, a hub download's .cache/) are left alone.

    Returns:
        True when verified; False (with a warning) for a folder without SHA256SUMS, e.g. a third-party export.

    Raises:
        ExportIntegrityError: a listed file is missing or its content changed, or an unlisted file may be loaded;
            the message names the file.
    """
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        log.warning("%s has no %s: its files cannot be verified", folder, MANIFEST)
        return False
    listed = set()
    for number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), start=1):
        expected, _, name = line.partition("  ")
        if len(expected) != 64 or not name:
            raise ExportIntegrityError(f"{manifest}: line {number} is not `<sha256>  <file>`: {line!r}")
        listed.add(name)
        path = folder / name
        if not path.is_file():
            raise ExportIntegrityError(f"{path}: listed in {MANIFEST} but missing; refusing to load the export")
        if sha256_file(path) != expected:
            raise ExportIntegrityError(
                f"{path}: sha256 differs from {MANIFEST} (the file changed or is corrupt since export); "
                "refusing to load the export"
            )
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name not in listed and _matches(path.name, LOADED_FILE_PATTERNS):
            raise ExportIntegrityError(
                f"{path}: not listed in {MANIFEST}, but a load of the export may read it (left from another export?); "
                "refusing to load the export: remove the file or export again"
            )
    return True


def export_step(folder: str | Path) -> int | None:
    """The optimiser step an export's weights are from (its `source.json`); None where it records none."""
    return recorded_step(Path(folder) / SOURCE, "step")


def recorded_step(path: Path, key: str) -> int | None:
    """The whole number a JSON file holds under `key` (a step it records); None where it holds none: no file, not a
    JSON mapping, no such key or another kind of value."""
    try:
        step = json.loads(path.read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _special_token_ids(tokenizer: Any) -> dict[str, int | None]:
    eos = tokenizer.eos_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return {"eos_token_id": eos, "bos_token_id": bos, "pad_token_id": pad}


def save_export(
    model: Any,
    out_dir: str | Path,
    tokenizer: Any = None,
    *,
    max_length: int | None = None,
    state_dict: dict[str, Any] | None = None,
    step: int | None = None,
) -> Path:
    """Writes a self-contained export of `model` (see the module docstring) and its SHA256SUMS.

    Args:
        model: a klalm `KLALMForCausalLM`; its config and generation config get the tokenizer's special-token ids.
        out_dir: the export folder (created).
        tokenizer: the model's tokenizer (None: a model without one, e.g. trained on random tokens).
        max_length: the context length the model was trained on, saved as the tokenizer's `model_max_length`.
        state_dict: the weights to write instead of `model.state_dict()` (e.g. gathered from FSDP shards).
        step: the optimiser step the weights are from, recorded in `source.json` (None: nothing recorded).

    Returns:
        out_dir.

    Raises:
        ExportTargetError: out_dir is a file, or a folder holding a file that is not part of an earlier export
            (nothing is written).
    """
    out_dir = Path(out_dir)
    if out_dir.parent.is_dir():
        _put_back(out_dir)
    check_export_target(out_dir)
    if tokenizer is not None:
        ids = _special_token_ids(tokenizer)
        for config in (model.config, model.generation_config):
            for key, value in ids.items():
                setattr(config, key, value)
        tokenizer = copy.deepcopy(tokenizer)  # the caller's tokenizer keeps its own settings
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if max_length is not None:
            tokenizer.model_max_length = max_length
    with _staged(out_dir) as staging, _transformers_quiet():
        model.save_pretrained(staging, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if step is not None:
            (staging / SOURCE).write_text(json.dumps({"step": step}) + "\n", encoding="utf-8")
        write_manifest(staging)
    return out_dir


def _listed_files(folder: Path) -> set[str]:
    """The relative paths a folder's SHA256SUMS lists (empty without one)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return set()
    return {line.partition("  ")[2] for line in manifest.read_text(encoding="utf-8").splitlines()}


# What `save_export` writes besides SHA256SUMS (save_pretrained's weights and configs, the model code, a tokenizer's
# files, source.json): a folder of only these, whose config.json is a klalm model's, is an earlier export made without
# SHA256SUMS.
EXPORT_FILE_PATTERNS = (
    "config.json", "generation_config.json", "model.safetensors", "model-*-of-*.safetensors",
    "model.safetensors.index.json", "config.py", "hf.py", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", SOURCE,
)  # fmt: skip
# What a load of an export folder may read: the above (source.json: klalm's check of a run folder), and transformers'
# PyTorch weights files.
LOADED_FILE_PATTERNS = (*EXPORT_FILE_PATTERNS, "pytorch_model.bin", "pytorch_model-*-of-*.bin",
                        "pytorch_model.bin.index.json")  # fmt: skip


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def _unlisted_klalm_export(folder: Path) -> bool:
    """A folder without SHA256SUMS holding only what an export writes, with a klalm config.json (an older export)."""
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return False
    files = [path for path in folder.rglob("*") if not path.is_dir()]
    return model_type == KLALMConfig.model_type and all(
        path.parent == folder and _matches(path.name, EXPORT_FILE_PATTERNS) for path in files
    )


def _put_back(out_dir: Path) -> None:
    """Mends what a replacement killed half-way left beside out_dir (`_staged`): with out_dir gone, the new export
    (complete when its SHA256SUMS verifies, written last) takes its place, else the earlier one set aside; then the
    leftovers are removed."""
    staged = sorted(out_dir.parent.glob(f".{glob.escape(out_dir.name)}.tmp-*"))
    aside = sorted(out_dir.parent.glob(f".{glob.escape(out_dir.name)}.old-*"), key=lambda path: path.stat().st_mtime)
    if not staged and not aside:
        return
    if out_dir.is_dir() and not any(out_dir.iterdir()):  # an empty folder made since: no export to keep
        out_dir.rmdir()
    if out_dir.exists() and not out_dir.is_dir():  # a file: refused by the check, and the leftovers kept
        return
    if not out_dir.exists():
        for folder in staged:
            try:
                complete = (folder / MANIFEST).is_file() and verify_export(folder)  # SHA256SUMS is written last
            except ExportIntegrityError:
                complete = False
            if complete:
                folder.rename(out_dir)
                log.warning("%s: put in place the export an interrupted replacement left in %s", out_dir, folder.name)
                break
        else:
            if aside:
                aside[-1].rename(out_dir)
                log.warning("%s: put back the earlier export an interrupted replacement set aside", out_dir)
    for folder in [*staged, *aside]:
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)


def check_export_target(out_dir: Path) -> None:
    """Refuses (`ExportTargetError`) an export target that is a file, or a folder holding anything but an earlier
    export (the files its SHA256SUMS lists, or a klalm export without one). Reads only: `klalm-train` calls it on
    every rank before it trains, `save_export` after mending what an interrupted replacement left (`_put_back`)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportTargetError(f"export folder {str(out_dir)!r} is a file; name a new or empty folder")
    if not out_dir.is_dir() or _unlisted_klalm_export(out_dir):
        return
    listed = _listed_files(out_dir)
    for path in sorted(out_dir.rglob("*")):
        name = path.relative_to(out_dir).as_posix()
        if path.is_dir() or name == MANIFEST or name in listed:
            continue
        why = f"not listed in its {MANIFEST}" if listed else f"the folder has no {MANIFEST}"
        raise ExportTargetError(
            f"export folder {str(out_dir)!r} already holds {name!r}, which is not part of an earlier export ({why}); "
            "refusing to write over it: name a new or empty folder"
        )


@contextlib.contextmanager
def _staged(out_dir: Path) -> Iterator[Path]:
    """A fresh folder beside out_dir to write into; renamed to out_dir when the block finishes (an earlier export there
    set aside first, put back if the rename fails, then removed), removed when the block fails."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not out_dir.is_dir():
        staging.rename(out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    out_dir.rename(old)
    try:
        staging.rename(out_dir)
    except BaseException:
        if not out_dir.exists():  # the rename failed (not a Ctrl-C just after it): the earlier export back
            old.rename(out_dir)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    log.info("replaced the earlier export in %s", out_dir)


def weight_mismatch(missing: Any, unexpected: Any, shaped: Any) -> list[str]:
    """What keeps stored weights from loading into a model, as phrases naming the first few: "2 missing (e.g. a, b)",
    "1 unexpected (e.g. c)", "1 of another shape (e.g. d (4, 8) for (8, 8))"; `shaped` holds (name, stored shape,
    wanted shape). Empty when they fit."""
    problems = [f"{len(keys)} {kind} (e.g. {', '.join(sorted(keys)[:3])})"
                for kind, keys in (("missing", missing), ("unexpected", unexpected)) if keys]  # fmt: skip
    if shaped:
        key, stored, wanted = sorted(shaped)[0]
        problems.append(f"{len(shaped)} of another shape (e.g. {key} {tuple(stored)} for {tuple(wanted)})")
    return problems


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[None]:
    """Writes and reads an export without transformers' chatter: no per-shard progress bars (an export is one small
    file) and no load report (`load_export_model` says what does not fit in one line of its own).

    The report is dropped by a filter on its logger, not by raising the logger's level: transformers checks a
    tensor-parallel plan only when that level is WARNING or above, and warns on every klalm model that "the following
    layers were not sharded".
    """
    from transformers.utils import logging as hf_logging

    hub_bars = importlib.import_module("huggingface_hub.utils.tqdm")  # the module; its package exports a class so named
    report = logging.getLogger("transformers.modeling_utils")

    def errors_only(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR

    bars, hub_states = hf_logging.is_progress_bar_enabled(), dict(hub_bars.progress_bar_states)
    report.addFilter(errors_only)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        report.removeFilter(errors_only)
        if bars:
            hf_logging.enable_progress_bar()
        hub_bars.progress_bar_states.clear()  # the hub's settings per group too, which enable/disable overwrite
        hub_bars.progress_bar_states.update(hub_states)


def load_export_model(folder: str | Path, **kwargs: Any) -> Any:
    """Loads an export's model with `AutoModelForCausalLM.from_pretrained`, after `verify_export`, refusing weights
    that do not fit its config.json.

    Args:
        folder: the export folder.
        kwargs: passed on to `from_pretrained`.

    Raises:
        ExportIntegrityError: a file differs from SHA256SUMS; the folder cannot be loaded (an unreadable config.json or
            weights file, an unknown model_type: the message's first line); or a weight of the model is missing from
            the folder, unexpected in it, or of another shape (the message names the first few and the config's arch).
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    verify_export(folder)
    try:
        options = {**kwargs, "output_loading_info": True, "ignore_mismatched_sizes": True}  # read, then refused below
        with _transformers_quiet():
            model, info = AutoModelForCausalLM.from_pretrained(folder, **options)
    except (OSError, ValueError, KeyError, SafetensorError) as err:  # unreadable config or weights, unknown model_type
        if isinstance(err, FileNotFoundError):
            raise
        raise ExportIntegrityError(f"{folder} cannot be loaded as a Hugging Face export: {one_line(err)}") from err
    problems = weight_mismatch(info.get("missing_keys") or (), info.get("unexpected_keys") or (),
                               info.get("mismatched_keys") or ())  # fmt: skip
    if problems:
        arch = getattr(model.config, "arch", None) or model.config.model_type
        raise ExportIntegrityError(
            f"{folder}: its weights do not fit its config.json (arch {arch!r}): {'; '.join(problems)}; refusing to "
            "load a model with untrained parts"
        )
    return model
