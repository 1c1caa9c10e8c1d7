"""Move pre-tokenised shards to a machine that can only be reached through small, separate transfers.

A GPU machine without network gets files only as carried folders of limited size (64 MiB a call there), and keeps
them only while it stays up. So the shard folder (``klalm-prepare-data``'s ``train/``, ``val/``, ``tokenizer/``) is
packed into xz-compressed pieces, one per shard file, each with its SHA-256 before and after compression, and the
pieces are carried in as many bundles as needed. Staging is idempotent and checksum-verified:

    pack   (here)    <shards>/<split>/tokens-NNNNN.bin  ->  <out>/<split>-tokens-NNNNN.bin.xz + manifest.json
    stage  (there)   every piece found in the given folders  ->  <shards>/<split>/tokens-NNNNN.bin, verified;
                     a piece already staged (size and hash match) is skipped; index.json lists the shards present

A split whose pieces did not all arrive gets an index of the shard files that did (in order) and
``"partial": true``; `stage` reports it, and the study records it, so a run on part of the data says so.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from klalm.fileio import atomic_path, write_atomic
from klalm.study.files import read_json

MANIFEST = "manifest.json"
INDEX_FILE = "index.json"  # the shard index written by klalm.data.shards (same name, same format)
SPLITS = ("train", "val")
TOKENIZER_DIR = "tokenizer"
_CHUNK = 1 << 22
KINDS = ("staged", "kept", "missing")


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _piece_name(target: str) -> str:
    return target.replace("/", "-") + ".xz"


def _pack_file(raw: Path, target: str, out: Path, preset: int) -> dict[str, Any]:
    piece = out / _piece_name(target)
    with open(raw, "rb") as src, lzma.open(piece, "wb", preset=preset) as dst:
        shutil.copyfileobj(src, dst, _CHUNK)
    return {
        "piece": piece.name,
        "bytes": raw.stat().st_size,
        "sha256": sha256_file(raw),
        "xz_bytes": piece.stat().st_size,
        "xz_sha256": sha256_file(piece),
    }


def pack(shards: str | Path, out: str | Path, *, preset: int = 9 | lzma.PRESET_EXTREME) -> dict[str, Any]:
    """Compresses every shard and tokenizer file of ``shards`` into ``out`` and writes the manifest there.

    Args:
        shards: a shard folder with ``train/``, ``val/`` (each with index.json) and ``tokenizer/``.
        out: output folder (created): one ``<split>-tokens-NNNNN.bin.xz`` per shard file, one
            ``tokenizer-<name>.xz`` per tokenizer file, and ``manifest.json`` (copy it into every bundle).
        preset: xz preset (default 9 extreme: about 1.1 bytes per GPT-2 token).

    Returns:
        The manifest: each split's index, and for each file (by its path in the shard folder) the piece's name and
        the raw and compressed sizes and SHA-256 hashes.

    Raises (before anything is written):
        ValueError: an index.json that does not parse.
        FileNotFoundError: a shard file an index lists is missing.
    """
    shards, out = Path(shards), Path(out)
    files = {f"{TOKENIZER_DIR}/{p.name}": p for p in sorted((shards / TOKENIZER_DIR).iterdir())}
    indexes = {split: read_json(shards / split / INDEX_FILE) for split in SPLITS}
    for split, index in indexes.items():
        files.update({f"{split}/{s['file']}": shards / split / s["file"] for s in index["shards"]})
    missing = [raw for raw in files.values() if not raw.is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} file(s) listed in an index.json do not exist, first {missing[0]}: "
                                "make the shard folder again (klalm-prepare-data)")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    pieces = {t: _pack_file(raw, t, out, preset) for t, raw in tqdm(files.items(), desc="xz", unit="file")}
    manifest = {"format": "klalm-staging-v1", "indexes": indexes, "pieces": pieces}
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def _find_manifest(sources: list[Path]) -> dict[str, Any]:
    found = [s / MANIFEST for s in sources if (s / MANIFEST).is_file()]
    if not found:
        raise FileNotFoundError(f"no {MANIFEST} in any of {[str(s) for s in sources]}: carry the folder `pack` wrote")
    manifests = [read_json(p) for p in found]
    if any(m != manifests[0] for m in manifests[1:]):
        raise ValueError(f"the manifests in {[str(p) for p in found]} differ: pieces of two different packs")
    return manifests[0]


def _stage_piece(entry: dict[str, Any], sources: list[Path], target: Path) -> str:
    """Decompresses one piece into ``target`` unless it is already there; returns "kept", "staged" or "missing"."""
    if target.is_file() and target.stat().st_size == entry["bytes"] and sha256_file(target) == entry["sha256"]:
        return "kept"
    piece = next((s / entry["piece"] for s in sources if (s / entry["piece"]).is_file()), None)
    if piece is None:
        return "missing"
    if sha256_file(piece) != entry["xz_sha256"]:
        raise ValueError(f"{piece}: checksum differs from the manifest (truncated or corrupted transfer)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as partial:
        with lzma.open(piece, "rb") as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
        if sha256_file(partial) != entry["sha256"]:
            raise ValueError(f"{piece}: decompressed bytes differ from the manifest's checksum")
    return "staged"


def stage(sources: list[str | Path], shards: str | Path) -> dict[str, Any]:
    """Decompresses and verifies every piece found in ``sources`` into the shard folder ``shards``.

    Args:
        sources: folders holding pieces (any subset) and a copy of the manifest (at least one of them).
        shards: the shard folder to fill (``train/``, ``val/``, ``tokenizer/``).

    Returns:
        Per split: "tokens" present, "total_tokens" of the full pack, "partial", and the shard files "staged",
        "kept" (already there and verified) and "missing".

    Raises:
        FileNotFoundError: no manifest, a tokenizer file missing, or a split with no shard at all.
        ValueError: a piece or a decompressed file whose checksum differs from the manifest.
    """
    sources, shards = [Path(s) for s in sources], Path(shards)
    manifest = _find_manifest(sources)
    status = {t: _stage_piece(e, sources, shards / t) for t, e in tqdm(manifest["pieces"].items(), desc="stage")}
    missing_tokenizer = sorted(t for t, s in status.items() if s == "missing" and t.startswith(TOKENIZER_DIR))
    if missing_tokenizer:
        raise FileNotFoundError(f"tokenizer files did not arrive: {missing_tokenizer}")
    report: dict[str, Any] = {}
    for split, full in manifest["indexes"].items():
        present = [s for s in full["shards"] if status[f"{split}/{s['file']}"] != "missing"]
        if not present:
            raise FileNotFoundError(f"no shard of the {split} split arrived (looked in {[str(s) for s in sources]})")
        index = {**full, "shards": present, "total_tokens": sum(s["tokens"] for s in present)}
        index["partial"] = len(present) < len(full["shards"])
        index["pack_total_tokens"] = full["total_tokens"]
        write_atomic(shards / split / INDEX_FILE, json.dumps(index, indent=1) + "\n")
        by_kind = {k: sorted(t for t, s in status.items() if s == k and t.startswith(f"{split}/")) for k in KINDS}
        report[split] = {"tokens": index["total_tokens"], "total_tokens": full["total_tokens"], **by_kind}
        report[split]["partial"] = index["partial"]
    return report
