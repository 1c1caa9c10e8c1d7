"""klalm.study.staging: pack, carry in bundles, stage: checksum-verified, idempotent, partial when pieces miss."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from klalm.data.shards import TokenShards
from klalm.study.staging import MANIFEST, pack, stage
from tests.study.conftest import tokens_of


def bundles(packed: Path, tmp_path: Path, first_train_files: int) -> tuple[Path, Path]:
    """Splits a pack into two bundles as a transfer would: tokenizer, val and the first train files; the rest."""
    one, two = tmp_path / "b1", tmp_path / "b2"
    for bundle in (one, two):
        bundle.mkdir()
        shutil.copy(packed / MANIFEST, bundle)
    train = sorted(packed.glob("train-*.xz"))
    for piece in [*packed.glob("tokenizer-*"), *packed.glob("val-*"), *train[:first_train_files]]:
        shutil.copy(piece, one)
    for piece in train[first_train_files:]:
        shutil.copy(piece, two)
    return one, two


def test_pack_then_stage_restores_every_byte(shard_folder, tmp_path):
    packed = tmp_path / "packed"
    manifest = pack(shard_folder, packed, preset=1)
    assert len([t for t in manifest["pieces"] if t.startswith("train/")]) > 2
    report = stage(bundles(packed, tmp_path, 2), tmp_path / "staged")
    for split in ("train", "val"):
        assert not report[split]["partial"] and not report[split]["missing"]
        assert (tokens_of(tmp_path / "staged" / split) == tokens_of(shard_folder / split)).all()
        staged = json.loads((tmp_path / "staged" / split / "index.json").read_text())
        assert staged["shards"] == json.loads((shard_folder / split / "index.json").read_text())["shards"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "staged/tokenizer" / name).read_bytes() == (shard_folder / "tokenizer" / name).read_bytes()


def test_a_missing_bundle_gives_a_partial_split_that_reads(shard_folder, tmp_path):
    packed = tmp_path / "packed"
    pack(shard_folder, packed, preset=1)
    first, _ = bundles(packed, tmp_path, 2)
    report = stage([first], tmp_path / "staged")
    assert report["train"]["partial"] and report["train"]["missing"]
    assert report["train"]["tokens"] < report["train"]["total_tokens"]
    index = json.loads((tmp_path / "staged/train/index.json").read_text())
    assert index["partial"] and index["total_tokens"] == report["train"]["tokens"]
    assert index["pack_total_tokens"] == report["train"]["total_tokens"]
    assert len(TokenShards(tmp_path / "staged/train")) == report["train"]["tokens"]  # the reader accepts it


def test_staging_again_keeps_what_is_there_and_adds_what_arrived(shard_folder, tmp_path):
    packed = tmp_path / "packed"
    pack(shard_folder, packed, preset=1)
    first, second = bundles(packed, tmp_path, 2)
    stage([first], tmp_path / "staged")
    report = stage([first, second], tmp_path / "staged")
    assert report["train"]["kept"] and report["train"]["staged"] and not report["train"]["missing"]
    assert not report["train"]["partial"]
    assert (tokens_of(tmp_path / "staged/train") == tokens_of(shard_folder / "train")).all()


def test_a_corrupted_piece_is_refused_by_name(shard_folder, tmp_path):
    packed = tmp_path / "packed"
    pack(shard_folder, packed, preset=1)
    piece = sorted(packed.glob("train-*.xz"))[1]
    data = bytearray(piece.read_bytes())
    data[len(data) // 2] ^= 0xFF
    piece.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=piece.name):
        stage([packed], tmp_path / "staged")


def test_a_damaged_staged_file_is_staged_again(shard_folder, tmp_path):
    packed = tmp_path / "packed"
    pack(shard_folder, packed, preset=1)
    stage([packed], tmp_path / "staged")
    shard = tmp_path / "staged/train/tokens-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])  # truncated, as by an interrupted copy
    report = stage([packed], tmp_path / "staged")
    assert report["train"]["staged"] == ["train/tokens-00000.bin"]
    assert (tokens_of(tmp_path / "staged/train") == tokens_of(shard_folder / "train")).all()


def test_stage_needs_a_manifest_and_every_split(shard_folder, tmp_path):
    packed = tmp_path / "packed"
    pack(shard_folder, packed, preset=1)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        stage([empty], tmp_path / "staged")
    for piece in packed.glob("val-*"):
        piece.unlink()
    with pytest.raises(FileNotFoundError, match="val split"):
        stage([packed], tmp_path / "staged")


def test_manifests_of_two_packs_are_not_mixed(shard_folder, tmp_path):
    one = tmp_path / "one"
    pack(shard_folder, one, preset=1)
    other = tmp_path / "other"
    other.mkdir()
    manifest = json.loads((one / MANIFEST).read_text())
    manifest["indexes"]["val"]["documents"] += 1
    (other / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="differ"):
        stage([one, other], tmp_path / "staged")


def test_pack_refuses_a_corrupt_index_or_a_missing_shard_before_writing(shard_folder, tmp_path):
    index = shard_folder / "val/index.json"
    good = index.read_text()
    index.write_text("{not json")
    with pytest.raises(ValueError, match=r"val/index.json:1: not valid JSON"):
        pack(shard_folder, tmp_path / "packed", preset=1)
    index.write_text(good)
    (shard_folder / "train/tokens-00001.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"train/tokens-00001.bin"):
        pack(shard_folder, tmp_path / "packed", preset=1)
    assert not (tmp_path / "packed").exists()  # no piece of a pack that could not be whole


def test_a_manifest_that_does_not_parse_is_named(tmp_path):
    (tmp_path / "pieces").mkdir()
    (tmp_path / "pieces" / MANIFEST).write_text("")
    with pytest.raises(ValueError, match=r"pieces/manifest.json:1: not valid JSON"):
        stage([tmp_path / "pieces"], tmp_path / "staged")
