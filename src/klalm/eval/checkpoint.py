"""Find and load the checkpoints `klalm-eval` evaluates: HF exports and Lightning training checkpoints.

Two kinds, told apart by what is on disk (`checkpoint_kind`):
- "hf_export": a folder with `config.json` (from `save_pretrained`); loaded with
  `klalm.models.export.load_export_model` (SHA256SUMS verified, weights that do not fit config.json refused) and
  `AutoTokenizer` (klalm's classes are registered with the Auto classes).
- "training": a Lightning `.ckpt` file, or a run folder (holding checkpoints or an export subfolder such as `hf/`);
  a run folder's `hf/` export loads as above (refused when the run has checkpoints beyond it), anything else with
  `klalm.models.checkpoint.load_model(path) -> (model, tokenizer)`.

Whatever cannot be loaded ends in one `FileNotFoundError`, `CheckpointError` or `ExportIntegrityError` naming the
path, and so does a tokenizer with ids beyond the model's embedding (`ConfigError`, naming `tokenizer=`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from klalm.config_checks import EVAL_DTYPES, ConfigError
from klalm.data.hub import check_hub
from klalm.errors import one_line
from klalm.models.checkpoint import HF_DIR, check_export_current, load_model, newest_valid, verify_checkpoint
from klalm.models.export import (  # (klalm.models registers the klalm classes with the Auto classes)
    MANIFEST,
    ExportIntegrityError,
    load_export_model,
    verify_export,
)
from klalm.models.params import count_parameters

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in EVAL_DTYPES}


@dataclass
class LoadedModel:
    """A model ready for evaluation and where it came from.

    Attributes:
        model: causal LM (`transformers.PreTrainedModel`), in eval mode on the target device and dtype.
        tokenizer: its tokenizer.
        provenance: JSON-able facts: checkpoint path and kind, arch, model_type, parameter count, dtype, device.
    """

    model: Any
    tokenizer: Any
    provenance: dict[str, Any] = field(default_factory=dict)


def _is_run_dir(folder: Path) -> bool:
    """A training run folder: holds a `.ckpt` somewhere below, or an HF export in a subfolder (e.g. `hf/`)."""
    return any(folder.rglob("*.ckpt")) or any(folder.glob("*/config.json"))


def checkpoint_kind(path: str | Path) -> str:
    """Kind of a checkpoint path: "hf_export" or "training" (see the module docstring).

    Raises:
        FileNotFoundError: the path does not exist, or holds neither `config.json` nor a `.ckpt` file.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.is_file():
        if path.suffix == ".ckpt":
            return "training"
        raise FileNotFoundError(f"checkpoint {str(path)!r} is a file but not a Lightning .ckpt file")
    if (path / "config.json").is_file():
        return "hf_export"
    if _is_run_dir(path):
        return "training"
    raise FileNotFoundError(
        f"checkpoint folder {str(path)!r} holds neither config.json (an HF export) nor what a training run's folder "
        "holds (checkpoints/step-*.ckpt, an hf/ export)"
    )


def check_checkpoint(path: str | Path) -> str:
    """`checkpoint_kind`, and the checks of what `load_checkpoint` would load that need no model built: an export's
    SHA256SUMS and config.json, a run folder's export not older than its checkpoints (`check_export_current`), a
    `.ckpt`'s sha256 and structure (tensors mapped, not read), a run folder's newest valid `.ckpt`. Run on every
    checkpoint before the first is evaluated, so a bad one fails in seconds.

    Raises:
        FileNotFoundError, CheckpointError, ExportIntegrityError: as `load_checkpoint` would, naming the path.
    """
    path = Path(path).expanduser()
    kind = checkpoint_kind(path)
    export = path / HF_DIR if (path / HF_DIR / "config.json").is_file() else path
    if export != path:
        check_export_current(path)
    if (export / "config.json").is_file():
        if (export / MANIFEST).is_file():  # (without one, the load warns that the files cannot be verified)
            verify_export(export)
        try:
            json.loads((export / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ExportIntegrityError(f"{export / 'config.json'} cannot be read as JSON: {err}") from None
    elif path.is_file():
        verify_checkpoint(path)
    elif newest_valid([path])[0] is None:
        load_model(path)  # a run folder without a valid .ckpt: its FileNotFoundError names the skipped ones
    return kind


def check_tokenizer(tokenizer: str | Path | None) -> None:
    """A `tokenizer=` written as a path (a hub id such as "gpt2" has at most one "/") must be a folder: refused before
    any weights load rather than as a hub error after.

    Raises:
        FileNotFoundError: naming the value.
    """
    if tokenizer is None:
        return
    value = str(tokenizer)
    path = Path(value).expanduser()
    if not path.is_dir() and (path.exists() or value.startswith(("/", ".", "~")) or value.count("/") > 1):
        what = "not a folder" if path.exists() else "no such folder"
        raise FileNotFoundError(f"tokenizer={value!r}: {what} (name a tokenizer folder, e.g. a run's hf/)")


def _tokenizer_from(folder: Path) -> Any:
    """`AutoTokenizer.from_pretrained(folder)`; a folder without a usable tokenizer raises FileNotFoundError naming
    it. A hub id (`check_tokenizer` lets one pass) comes from the Hugging Face cache when it is there; else a hub that
    cannot be reached is a FileNotFoundError at once (`klalm.data.hub.check_hub`), not after ~50 s of retries."""
    from transformers import AutoTokenizer

    if not folder.is_dir():
        try:
            return AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError):
            check_hub(f"tokenizer={folder}", "name a tokenizer folder (e.g. a run's hf/)")
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(
            f"no usable tokenizer in {str(folder)!r} ({one_line(err)}); pass tokenizer=FOLDER to name one"
        ) from err


def _load_hf_export(path: Path, tokenizer: str | Path | None) -> tuple[Any, Any]:
    model = load_export_model(path)
    return model, _tokenizer_from(Path(tokenizer).expanduser() if tokenizer is not None else path)


def _load_training(path: Path, tokenizer: str | Path | None) -> tuple[Any, Any]:
    model, tok = load_model(path)
    if tokenizer is not None:
        tok = _tokenizer_from(Path(tokenizer).expanduser())
    if tok is None:
        raise FileNotFoundError(f"training checkpoint {str(path)!r} has no tokenizer; pass tokenizer=FOLDER")
    return model, tok


LOADERS: dict[str, Callable[[Path, str | Path | None], tuple[Any, Any]]] = {
    "hf_export": _load_hf_export,
    "training": _load_training,
}


def resolve_device(device: str) -> torch.device:
    """`"auto"` → CUDA when available, else CPU (the choice is logged); anything else is taken as given.

    Raises:
        ConfigError: a CUDA device where torch sees none, `cuda:N` / `xpu:N` beyond the devices torch sees, or an
            `mps` / `xpu` device this torch cannot use (each was a RuntimeError once the model had loaded).
    """
    if device != "auto":
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device={device!r}: torch sees no CUDA GPU here; use device=auto or cpu")
        parsed = torch.device(device)
        if parsed.type == "mps":
            count = int(torch.backends.mps.is_available())
        elif parsed.type in ("cuda", "xpu"):
            backend = getattr(torch, parsed.type)
            count = backend.device_count() if backend.is_available() else 0
        else:
            return parsed
        if count == 0:
            raise ConfigError(f"device={device!r}: torch cannot use {parsed.type} devices here; use device=auto or cpu")
        if parsed.index is not None and parsed.index >= count:
            raise ConfigError(f"device={device!r}: torch sees {count} {parsed.type} device(s) here, "
                              f"{parsed.type}:0 to {parsed.type}:{count - 1}")  # fmt: skip
        return parsed
    chosen = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log.info("device=auto chose %s", chosen)
    return chosen


def resolve_dtype(dtype: str) -> torch.dtype:
    """A dtype name from `DTYPES`.

    Raises:
        KeyError: unknown name; the message lists the valid ones.
    """
    if dtype not in DTYPES:
        raise KeyError(f"unknown dtype {dtype!r}; valid: {sorted(DTYPES)}")
    return DTYPES[dtype]


def describe_model(model: Any) -> dict[str, Any]:
    """Architecture facts of a loaded model for the results' provenance."""
    config = model.config
    return {
        "arch": getattr(config, "arch", None) or config.model_type,
        "model_type": config.model_type,
        "model_class": type(model).__name__,
        "n_params": count_parameters(model),
    }


def load_checkpoint(
    path: str | Path,
    *,
    tokenizer: str | Path | None = None,
    device: str = "auto",
    dtype: str = "float32",
) -> LoadedModel:
    """Load a checkpoint of either kind for evaluation.

    Args:
        path: HF export folder, Lightning `.ckpt` file, or run folder holding a `.ckpt`.
        tokenizer: tokenizer folder to use instead of the checkpoint's own (None: the checkpoint's).
        device: "auto", "cpu", "cuda", "cuda:1", ...
        dtype: weight dtype, a key of `DTYPES`.

    Returns:
        The model in eval mode on `device` in `dtype`, its tokenizer and provenance.

    Raises:
        FileNotFoundError: missing or unrecognised checkpoint, or no tokenizer in it.
        CheckpointError: a `.ckpt` that cannot be read, trusted or rebuilt.
        ExportIntegrityError: an export whose files changed, cannot be read, or whose weights do not fit its config.
        ConfigError: a tokenizer with more tokens than the model's embedding has rows.
        KeyError: unknown dtype.
    """
    path = Path(path).expanduser()
    kind = checkpoint_kind(path)
    torch_dtype = resolve_dtype(dtype)
    target = resolve_device(device)
    model, tok = LOADERS[kind](path, tokenizer)
    rows = model.get_input_embeddings().num_embeddings
    if len(tok) > rows:  # its highest ids would index past the embedding (an IndexError in the middle of a task)
        named = f"tokenizer={tokenizer}" if tokenizer is not None else f"the tokenizer of {path}"
        raise ConfigError(
            f"{named} has {len(tok):,} tokens but the model's embedding has {rows:,} rows: not the model's tokenizer"
        )
    model = model.to(device=target, dtype=torch_dtype).eval()
    provenance = {"checkpoint": str(path.resolve()), "kind": kind, **describe_model(model)}
    provenance.update(dtype=dtype, device=str(target), tokenizer=type(tok).__name__, vocab_size=len(tok))
    return LoadedModel(model=model, tokenizer=tok, provenance=provenance)
