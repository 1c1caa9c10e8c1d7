"""Hugging Face exports: write a model (and its tokenizer) as a folder that loads anywhere, and check one before use.

An export is `save_pretrained` output (safetensors) plus:
- `auto_map` in config.json and the model code beside it (config.py, hf.py: klalm/models/__init__.py registers both
  classes for their Auto class), so `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` and
  `lm-eval --model hf --model_args pretrained=dir,trust_remote_code=True` work in a Python that never imports klalm
  itself (the copied code imports klalm, which must be installed, as fla's exports need fla);
- the tokenizer's EOS / BOS / padding ids in config.json and generation_config.json (padding = EOS when the tokenizer
  has no padding token), and `model_max_length` = the context the model was trained on in the tokenizer files;
- `SHA256SUMS`: the sha256 of every other file, written last (`sha256sum -c SHA256SUMS` checks it too).
  `verify_export` recomputes it; `klalm-eval` and `klalm.models.checkpoint.load_model` refuse an export whose files
  changed since.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MANIFEST = "SHA256SUMS"
_CHUNK_BYTES = 1 << 20


class ExportIntegrityError(ValueError):
    """An export's file does not match its SHA256SUMS entry (or is missing); the message names the file."""


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
    """Checks every file listed in `<folder>/SHA256SUMS` against its sha256.

    Returns:
        True when verified; False (with a warning) for a folder without SHA256SUMS, e.g. a third-party export.

    Raises:
        ExportIntegrityError: a listed file is missing or its content changed; the message names the file.
    """
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        log.warning("%s has no %s: its files cannot be verified", folder, MANIFEST)
        return False
    for number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), start=1):
        expected, _, name = line.partition("  ")
        if len(expected) != 64 or not name:
            raise ExportIntegrityError(f"{manifest}: line {number} is not `<sha256>  <file>`: {line!r}")
        path = folder / name
        if not path.is_file():
            raise ExportIntegrityError(f"{path}: listed in {MANIFEST} but missing; refusing to load the export")
        if sha256_file(path) != expected:
            raise ExportIntegrityError(
                f"{path}: sha256 differs from {MANIFEST} (the file changed or is corrupt since export); "
                "refusing to load the export"
            )
    return True


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
) -> Path:
    """Writes a self-contained export of `model` (see the module docstring) and its SHA256SUMS.

    Args:
        model: a klalm `KLALMForCausalLM`; its config and generation config get the tokenizer's special-token ids.
        out_dir: the export folder (created).
        tokenizer: the model's tokenizer (None: a model without one, e.g. trained on random tokens).
        max_length: the context length the model was trained on, saved as the tokenizer's `model_max_length`.
        state_dict: the weights to write instead of `model.state_dict()` (e.g. gathered from FSDP shards).

    Returns:
        out_dir.
    """
    out_dir = Path(out_dir)
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
    model.save_pretrained(out_dir, state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    write_manifest(out_dir)
    return out_dir
