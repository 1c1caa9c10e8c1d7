"""What a training run leaves, read back: the run folder's layout, verified checkpoint files, and `load_model`.

Layout of a run directory (`paths.run_dir`; `klalm.train.checkpoint` writes it):

    checkpoints/step-00000100.ckpt   Lightning checkpoints (model, optimiser, scheduler, data-loader state,
                                     RNG, tokens seen), the last `keep_last` of them
    checkpoints/step-00000100.ckpt.sha256   its sha256, written before the checkpoint gets its name
                                     (`sha256sum -c` format)
    tokenizer/                       the run's tokenizer (HF `save_pretrained` layout)
    hf/                              final export (klalm.models.export): model, tokenizer, model code, the step
                                     it was made at and SHA256SUMS; `AutoModelForCausalLM.from_pretrained` after
                                     `import klalm`, or with trust_remote_code=True
    summary.json                     final numbers of the run's last finished start (`steps`: its last step,
                                     where it exported unless `exported` is false)

`verify_checkpoint` checks a file against its sha256 and the safe loader before a resume uses it (a zip checkpoint
carries no checksum that torch checks: flipped bytes inside a tensor would load silently). Checkpoints are read only
with `torch.load(..., weights_only=True)` (`load_checkpoint_file`): the safe unpickler builds tensors and plain
Python data and refuses anything else, so a planted `.ckpt` cannot run code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from klalm.errors import one_line
from klalm.models import build_model
from klalm.models.export import MANIFEST, SOURCE, export_step, load_export_model, recorded_step, weight_mismatch
from klalm.param_names import clean_name

log = logging.getLogger(__name__)

CKPT_DIR = "checkpoints"
TOKENIZER_DIR = "tokenizer"
HF_DIR = "hf"
SUMMARY_FILE = "summary.json"
CHECKSUM_SUFFIX = ".sha256"
_CKPT_RE = re.compile(r"^step-(\d+)\.ckpt$")


class CheckpointError(ValueError):
    """A checkpoint file that klalm refuses to load: not a klalm checkpoint, unsafe, truncated or corrupted."""


def load_checkpoint_file(path: str | os.PathLike, *, mmap: bool = False) -> dict[str, Any]:
    """Reads a klalm-train checkpoint with the safe unpickler (`weights_only=True`), onto the CPU.

    Args:
        path: a `step-<N>.ckpt` file.
        mmap: map the tensors' storage instead of reading it (cheap checks of a large file).

    Returns:
        The checkpoint dictionary (Lightning's entries plus "klalm").

    Raises:
        CheckpointError: one line naming the file and why: it refers to code the safe unpickler refuses (not a
            trusted klalm checkpoint), it cannot be read (truncated or corrupted), or it lacks klalm's entries.
    """
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        unsafe = _unsafe_globals(path)
        if unsafe is None:  # the pickle failed for another reason than a refused callable: not a checkpoint at all
            raise CheckpointError(
                f"{path} cannot be read as a checkpoint (truncated or corrupted?): not a torch checkpoint file"
            ) from None
        raise CheckpointError(
            f"{path} is not a trusted klalm checkpoint: it refers to {unsafe}, which the safe loader "
            "(torch.load with weights_only=True) refuses to call; klalm-train writes only tensors and plain data, so "
            "this file came from elsewhere: do not load it with weights_only=False"
        ) from None
    except (RuntimeError, EOFError, OSError, KeyError, ValueError, IndexError, TypeError) as err:
        # what the unpickler raises on bytes that are not an intact checkpoint (a few bytes: KeyError)
        reason = f"{type(err).__name__}: {one_line(err)}" if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path} cannot be read as a checkpoint (truncated or corrupted?): {reason}") from None
    if not isinstance(checkpoint, dict) or not {"klalm", "state_dict"} <= checkpoint.keys():
        raise CheckpointError(f"{path} is not a klalm-train checkpoint: it lacks the 'klalm' or 'state_dict' entry")
    return checkpoint


def verify_checkpoint(path: Path) -> None:
    """Checks a checkpoint before a resume trusts it: the sha256 written at save time (when its `.sha256` file is
    there: checkpoints copied without it are checked by loading only), then a safe load of its structure (the
    tensors are mapped, not read).

    Raises:
        CheckpointError: one line naming the file and what is wrong with it.
    """
    sidecar = checksum_path(path)
    try:
        if sidecar.is_file() and sidecar.read_text().split()[:1] != [file_sha256(path)]:
            raise CheckpointError(f"{path} does not match the sha256 in {sidecar.name}, written when it was saved")
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read: {err}") from None
    load_checkpoint_file(path, mmap=True)


def checksum_path(path: Path) -> Path:
    """The `.sha256` file that belongs to a checkpoint."""
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _unsafe_globals(path: str | os.PathLike) -> str | None:
    """The Python callables a checkpoint's pickle names beyond the safe set, read without unpickling anything:
    their names for a zip checkpoint, "Python objects" for an old-style (bare pickle) one, whose names cannot be
    listed safely, and None when the file is neither a readable zip nor a pickle (not a checkpoint at all)."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (RuntimeError, ValueError, OSError):  # not a readable zip checkpoint
        with open(path, "rb") as handle:
            return "Python objects" if handle.read(1) == pickle.PROTO else None
    return ", ".join(names) if names else None


def checkpoint_step(path: Path) -> int:
    """The optimiser step encoded in a checkpoint file name `step-XXXXXXXX.ckpt`."""
    match = _CKPT_RE.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not a klalm checkpoint name (expected step-<N>.ckpt)")
    return int(match.group(1))


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints of one run directory, oldest step first (temporary files excluded)."""
    folder = Path(run_dir) / CKPT_DIR
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if _CKPT_RE.match(p.name)), key=checkpoint_step)


def newest_first(run_dirs: list[Path]) -> list[Path]:
    """Checkpoints of several run directories, the most recently written run first and each run's checkpoints
    highest step first: the run that wrote a checkpoint last is the one a restart means to continue (a finished
    run with more steps is not), and within a run a damaged newest file falls back to the run's next one before any
    other run's. "Written" is the files' modification time, which a copy made without keeping times (`cp -a` and
    `rsync -t` keep them) sets to the time of the copy; runs written at the same time go by highest step, then by
    folder name, the later first.

    A file that vanishes while this looks (pruned by the run that writes it) is passed over.
    """
    runs = []
    for run_dir in run_dirs:
        keyed = []
        for path in list_checkpoints(run_dir):
            try:
                keyed.append((path.stat().st_mtime, checkpoint_step(path), path))
            except FileNotFoundError:
                continue
        if keyed:
            paths = [p for *_, p in sorted(keyed, key=lambda k: k[1], reverse=True)]
            runs.append((max(written for written, *_ in keyed), checkpoint_step(paths[0]), str(run_dir), paths))
    return [path for *_, paths in sorted(runs, key=lambda run: run[:3], reverse=True) for path in paths]


def find_latest(run_dirs: list[Path]) -> Path | None:
    """The newest checkpoint over several run directories (`newest_first`), or None."""
    candidates = newest_first(run_dirs)
    return candidates[0] if candidates else None


def newest_valid(run_dirs: list[Path]) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that passes `verify_checkpoint`, and why each newer one was skipped.

    Returns:
        (path or None when none passes, ["<path>: <reason>", ...] for the skipped ones, newest first).
    """
    skipped = []
    for path in newest_first(run_dirs):
        try:
            verify_checkpoint(path)
        except CheckpointError as err:
            skipped.append(str(err))
            continue
        return path, skipped
    return None, skipped


def check_export_current(run_dir: Path) -> None:
    """A run folder's `hf/` export must hold the run's latest weights. A run resumed after it exported (for more steps)
    writes checkpoints beyond the export until it finishes and exports again; loading the folder then gave the older
    model without a word. The run's highest checkpoint step is compared with, in this order:
    - the step the export records (`klalm.models.export.export_step`);
    - for an export that records none (made before exports did), the `steps` of the run's `summary.json`, the last
      step of its last finished start, which exports just before it writes the summary (`_summary_export_step`: not
      where the summary says that start did not export);
    - without either, the modification times of the newest checkpoint and the export, which a copy that did not keep
      them (`cp -r`) can put in any order.

    Raises:
        CheckpointError: one line naming the export, the later checkpoint and the evidence that decided, how to load
            either by its own path, and the command that exports again.
    """
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        return
    export, newest = run_dir / HF_DIR, checkpoints[-1]
    step = export_step(export)
    if step is not None:
        evidence = f"{export} holds the weights of step {step} (its {SOURCE})"
    else:
        step = _summary_export_step(run_dir / SUMMARY_FILE)
        evidence = f"{export} records no step, and the run's {SUMMARY_FILE} ends at step {step} (where it exported)"
    if step is not None:
        if checkpoint_step(newest) <= step:
            return
        stale = f"{evidence}, but the run has the later checkpoint {newest}"
    else:
        written = export / MANIFEST if (export / MANIFEST).is_file() else export / "config.json"
        if newest.stat().st_mtime <= written.stat().st_mtime:
            return
        stale = (
            f"{export} was written before the run's checkpoint {newest} (by modification time: neither the export nor "
            f"the run's {SUMMARY_FILE} records the step it was made at)"
        )
    raise CheckpointError(
        f"{stale}: name the one to load by its path, or finish the run to export it again (klalm-train with the "
        f"run's overrides and resume={run_dir})"
    )


def _summary_export_step(summary: Path) -> int | None:
    """The step a run's `summary.json` dates its export by: its `steps`, where the start that wrote it exported just
    before. None where the summary holds no such step, or says `"exported": false` (a start with
    train.export_hf=false, or one a SIGTERM stopped before its export: `klalm.train.app.finish`), which leaves an
    earlier export behind a later summary; summaries written before they said so (their start exported) date it."""
    try:
        exported = json.loads(summary.read_text(encoding="utf-8")).get("exported")
    except (OSError, ValueError, AttributeError):
        return None
    return None if exported is False else recorded_step(summary, "steps")


def model_state_from_checkpoint(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The inner model's state dict from a Lightning checkpoint of `LMModule` (prefix `model.` removed)."""
    state = checkpoint["state_dict"]
    return {clean_name(k).removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def load_model(path: str | os.PathLike) -> tuple[Any, Any]:
    """Loads a trained model and its tokenizer from a run directory, an HF export or a Lightning `.ckpt`.

    Args:
        path: a run directory (uses its `hf/` export if present, refused when older than the run's checkpoints, else
            its newest valid checkpoint), an HF export folder (`config.json` inside), or a `step-<N>.ckpt` file written
            by `klalm-train`.

    Returns:
        (model, tokenizer): a `transformers.PreTrainedModel` in eval mode on the CPU and the run's tokenizer (None for
        runs on synthetic data, which have none).

    Raises:
        FileNotFoundError: naming the path when it holds neither an export nor a checkpoint.
        CheckpointError: a `.ckpt` that cannot be read, is not trusted, or does not rebuild into its model; a run
            directory whose `hf/` export is older than its checkpoints (`check_export_current`).
        klalm.models.export.ExportIntegrityError: an export file differs from the export's SHA256SUMS, or the export
            cannot be loaded or its weights do not fit its config.json (`load_export_model`).
    """
    path = Path(path)
    if path.is_dir() and (path / HF_DIR / "config.json").is_file():
        check_export_current(path)
        path = path / HF_DIR
    if path.is_dir() and (path / "config.json").is_file():
        return load_export_model(path).eval(), _load_tokenizer(path)
    if path.is_dir():
        latest, skipped = newest_valid([path])
        for reason in skipped:
            log.warning("skipped %s", reason)
        if latest is None:
            if path.name == CKPT_DIR and list_checkpoints(path.parent):  # (it said the folder held no step-*.ckpt)
                raise FileNotFoundError(f"{path} is a run's {CKPT_DIR}/ folder: name the run folder {path.parent} or "
                                        "one of the .ckpt files")  # fmt: skip
            reasons = f" (skipped: {'; '.join(skipped)})" if skipped else ""
            raise FileNotFoundError(f"{path} has no {HF_DIR}/ export and no valid {CKPT_DIR}/step-*.ckpt{reasons}")
        path = latest
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return _load_lightning_checkpoint(path)


MODEL_BUILDER = "klalm.models.build_model"  # the one `_target_` a checkpoint's model config may name


def _load_lightning_checkpoint(path: Path) -> tuple[Any, Any]:
    checkpoint = load_checkpoint_file(path)
    try:
        meta = checkpoint["klalm"]
        config = dict(meta["model_config"])
        vocab_size = meta["vocab_size"]
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: its 'klalm' entry lacks the model config or vocab size ({err!r})") from None
    # The config comes from the file: build through klalm's builder only, never through an arbitrary `_target_`.
    if config.get("_target_") != MODEL_BUILDER:
        raise CheckpointError(f"{path}: its model config names {config.get('_target_')!r}, not {MODEL_BUILDER}")
    kwargs = {k: v for k, v in config.items() if not k.startswith("_")}
    try:
        model = build_model(**{**kwargs, "vocab_size": vocab_size})
    except (KeyError, TypeError, ValueError, RuntimeError) as err:  # a config build_model refuses
        raise CheckpointError(f"{path}: its model config does not build: {one_line(err)}") from None
    state = model_state_from_checkpoint(checkpoint)
    wanted = model.state_dict()
    shaped = [(k, tuple(getattr(state[k], "shape", ())), tuple(wanted[k].shape)) for k in wanted.keys() & state.keys()
              if getattr(state[k], "shape", None) != wanted[k].shape]  # fmt: skip
    problems = weight_mismatch(wanted.keys() - state.keys(), state.keys() - wanted.keys(), shaped)
    if problems:
        raise CheckpointError(f"{path}: its weights do not fit its model config: {'; '.join(problems)}")
    model.load_state_dict(state)
    tokenizer_dir = path.parent.parent / TOKENIZER_DIR
    return model.eval(), _load_tokenizer(tokenizer_dir)


def _load_tokenizer(folder: Path) -> Any:
    if not (folder / "tokenizer_config.json").is_file():
        return None
    return AutoTokenizer.from_pretrained(folder)
