"""Export edges: the target folder (refused when it holds other files, replaced whole when it is an earlier export,
untouched when the export fails) and the strict loader (weights that do not fit config.json are refused)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from klalm.data.tokenizer import train_bpe_tokenizer
from klalm.models import build_model
from klalm.models.checkpoint import load_model
from klalm.models.export import (
    MANIFEST,
    SOURCE,
    ExportIntegrityError,
    ExportTargetError,
    export_step,
    load_export_model,
    save_export,
    verify_export,
)

VOCAB = 300
SMALL = {"d_model": 32, "n_layers": 1, "d_ff": 64}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = [f"line {i}: the state is predicted, then corrected." for i in range(200)]
    return train_bpe_tokenizer(texts, VOCAB, tmp_path_factory.mktemp("tok"))


def _model(arch: str = "gpt") -> torch.nn.Module:
    torch.manual_seed(0)
    heads = {"n_heads": 2} if arch in ("gpt", "gpt_kla") else {}
    return build_model(arch, vocab_size=VOCAB, **SMALL, **heads).eval()


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_a_folder_holding_other_files_is_refused_and_left_alone(tmp_path, tokenizer):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    (target / "config.json").write_text("{}")  # not listed in any SHA256SUMS: not an export's
    with pytest.raises(ExportTargetError, match=r"already holds 'config\.json'.*name a new or empty folder"):
        save_export(_model(), target, tokenizer)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "notes.txt"]
    assert (target / "config.json").read_text() == "{}" and _leftovers(tmp_path) == []


def test_a_file_as_target_is_refused(tmp_path, tokenizer):
    target = tmp_path / "model.bin"
    target.write_bytes(b"x")
    with pytest.raises(ExportTargetError, match=r"model\.bin' is a file"):
        save_export(_model(), target, tokenizer)
    assert target.read_bytes() == b"x"


def test_an_earlier_export_is_replaced_whole(tmp_path, tokenizer):
    """Its files do not survive into the new export (a stale tokenizer would load with the new model, checksummed)."""
    target = tmp_path / "hf"
    save_export(_model("gpt"), target, tokenizer, max_length=32)
    assert (target / "tokenizer.json").is_file()
    save_export(_model("kla"), target)  # a model without a tokenizer, into the same folder
    names = sorted(p.name for p in target.iterdir())
    assert "tokenizer.json" not in names and "tokenizer_config.json" not in names, names
    assert verify_export(target) and _leftovers(tmp_path) == []
    model, tok = load_model(target)
    assert model.config.arch == "kla" and tok is None


def test_a_failed_export_leaves_nothing_and_keeps_the_earlier_one(tmp_path, tokenizer, monkeypatch):
    target = tmp_path / "hf"
    save_export(_model(), target, tokenizer)
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(type(tokenizer), "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        save_export(_model("kla"), target, tokenizer)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    with pytest.raises(OSError, match="disk full"):
        save_export(_model("kla"), tmp_path / "new", tokenizer)
    assert not (tmp_path / "new").exists() and _leftovers(tmp_path) == []


def _relabelled(export: Path, folder: Path, arch: str) -> Path:
    """A copy of an export whose config.json names another arch, without SHA256SUMS (as a hand-edited copy)."""
    shutil.copytree(export, folder)
    (folder / MANIFEST).unlink()
    config = json.loads((folder / "config.json").read_text())
    config["arch"] = arch
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("arch", "as_arch", "problem"),
    [("kla", "mamba", r"missing .*unexpected"), ("gpt", "gpt_kla", r"of another shape \(e\.g\. model\.layers\.0")],
)
def test_weights_that_do_not_fit_the_config_are_refused(tmp_path, tokenizer, arch, as_arch, problem):
    """kla weights under a mamba config loaded with random mamba weights after a warning; gpt under gpt_kla raised
    transformers' multi-line RuntimeError. Both are one ExportIntegrityError naming the folder and the arch now."""
    export = save_export(_model(arch), tmp_path / "hf", tokenizer)
    folder = _relabelled(export, tmp_path / "relabelled", as_arch)
    with pytest.raises(
        ExportIntegrityError,
        match=rf"relabelled: its weights do not fit its config\.json \(arch "
        rf"'{as_arch}'\): .*{problem}",
    ) as info:
        load_export_model(folder)
    assert "\n" not in str(info.value)


def test_the_strict_loader_loads_a_good_export_exactly(tmp_path, tokenizer):
    model = _model("gpt_kla")
    export = save_export(model, tmp_path / "hf", tokenizer)
    loaded = load_export_model(export)
    ids = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids).logits, model(ids).logits)


def test_load_model_refuses_an_export_relabelled_as_another_arch_and_a_garbage_ckpt(tmp_path):
    """`klalm.models.checkpoint.load_model` (the Python API) is as strict as klalm-eval: it loaded a relabelled export
    with random mixer weights after a warning, and raised a bare KeyError on a few bytes named .ckpt."""
    from klalm.models.checkpoint import CheckpointError

    torch.manual_seed(0)
    out = save_export(build_model("kla", vocab_size=64, d_model=32, n_layers=1, d_ff=64).eval(), tmp_path / "hf")
    (out / MANIFEST).unlink()
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "arch": "mamba"}))
    with pytest.raises(ExportIntegrityError, match=r"weights do not fit its config\.json \(arch 'mamba'\)"):
        load_model(tmp_path)
    garbage = tmp_path / "step-00000001.ckpt"
    garbage.write_bytes(b"hello")
    with pytest.raises(CheckpointError, match=r"cannot be read as a checkpoint .*KeyError"):
        load_model(garbage)


def test_a_ckpt_whose_weights_do_not_fit_its_config_names_the_weight(tmp_path):
    """A training checkpoint missing a weight, or holding one of another shape: the line names it (it was the header
    of load_state_dict's error, "Error(s) in loading state_dict for ...:", ending in a colon)."""
    from klalm.models.checkpoint import MODEL_BUILDER, CheckpointError

    config = {"_target_": MODEL_BUILDER, "arch": "kla", "d_model": 32, "n_layers": 1, "d_ff": 64}
    weights = build_model("kla", vocab_size=64, d_model=32, n_layers=1, d_ff=64).state_dict()
    key = next(k for k in weights if k.endswith("in_proj.weight") or k.endswith("proj.weight"))
    for name, state, message in (
        ("missing", {k: v for k, v in weights.items() if k != key}, rf"1 missing \(e\.g\. {key}\)"),
        ("shape", {**weights, key: weights[key][:1]}, rf"1 of another shape \(e\.g\. {key} \(1, "),
    ):
        path = tmp_path / name / "checkpoints" / "step-00000001.ckpt"
        path.parent.mkdir(parents=True)
        meta = {"model_config": config, "vocab_size": 64}
        torch.save({"klalm": meta, "state_dict": {f"model.{k}": v for k, v in state.items()}}, path)
        with pytest.raises(CheckpointError, match=rf"weights do not fit its model config: {message}"):
            load_model(path)
    path = tmp_path / "ok" / "checkpoints" / "step-00000001.ckpt"
    path.parent.mkdir(parents=True)
    torch.save({"klalm": meta, "state_dict": {f"model.{k}": v for k, v in weights.items()}}, path)
    assert load_model(path)[0].config.arch == "kla"


def test_an_export_without_sha256sums_is_replaced_but_not_a_folder_with_more(tmp_path, tokenizer):
    """An export made without SHA256SUMS (an older klalm) is an earlier export: replaced whole (it was refused as if
    its config.json were someone else's); with any other file beside it, refused, saying it has no SHA256SUMS."""
    target = save_export(_model(), tmp_path / "hf", tokenizer)
    (target / MANIFEST).unlink()
    save_export(_model("kla"), target, tokenizer)
    assert json.loads((target / "config.json").read_text())["arch"] == "kla" and verify_export(target)
    (target / MANIFEST).unlink()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(ExportTargetError, match=r"holds 'config\.json'.*\(the folder has no SHA256SUMS\)"):
        save_export(_model(), target, tokenizer)
    assert (target / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("complete", [True, False], ids=["new-export-complete", "new-export-partial"])
def test_an_export_killed_between_its_renames_is_mended_by_the_next(tmp_path, tokenizer, complete):
    """Killed after the earlier export was set aside and before the new one took its name: no hf/ at all. The next
    export puts the new one in place if its SHA256SUMS verifies, else the earlier one back, and clears the rest."""
    earlier = save_export(_model("gpt"), tmp_path / "hf", tokenizer)
    new = save_export(_model("kla"), tmp_path / "staging", tokenizer)
    if not complete:
        (new / MANIFEST).unlink()  # SHA256SUMS is written last: without it the copy was cut short
    earlier.rename(tmp_path / ".hf.old-123")
    new.rename(tmp_path / ".hf.tmp-123")
    from klalm.models.export import _put_back

    _put_back(tmp_path / "hf")
    kept = json.loads((tmp_path / "hf" / "config.json").read_text())["arch"]
    assert kept == ("kla" if complete else "gpt") and _leftovers(tmp_path) == []
    (tmp_path / "hf").rename(tmp_path / ".hf.old-7")  # and save_export mends first, then replaces
    save_export(_model("mamba"), tmp_path / "hf", tokenizer)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["arch"] == "mamba" and _leftovers(tmp_path) == []


def test_mending_treats_an_empty_target_as_missing_and_keeps_leftovers_beside_a_file(tmp_path, tokenizer):
    """An empty hf/ made after a kill between the renames: the new export still takes its place (both exports were
    deleted); a file named hf: refused, the leftovers kept."""
    from klalm.models.export import _put_back

    new = save_export(_model("kla"), tmp_path / "staging", tokenizer)
    new.rename(tmp_path / ".hf.tmp-111")
    save_export(_model("gpt"), tmp_path / "old", tokenizer).rename(tmp_path / ".hf.old-111")
    (tmp_path / "hf").mkdir()
    _put_back(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["arch"] == "kla" and _leftovers(tmp_path) == []
    (tmp_path / "hf").rename(tmp_path / ".hf.old-5")
    (tmp_path / "hf").write_text("a file")
    _put_back(tmp_path / "hf")
    assert _leftovers(tmp_path) == [".hf.old-5"]


def test_exporting_and_loading_print_no_transformers_chatter(tmp_path, tokenizer, capfd):
    """No per-shard progress bars and no "layers were not sharded" warning (transformers checks a tensor-parallel
    plan when its loader's logger is quieted by level); the progress-bar settings are the caller's again afterwards,
    the hub's per group included."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    disable_progress_bars("huggingface_hub.http_get")  # the caller's: one group's bars off, the rest on
    try:
        capfd.readouterr()
        export = save_export(_model("kla"), tmp_path / "hf", tokenizer)
        load_export_model(export)
        printed = "".join(capfd.readouterr())
        assert "shards" not in printed and "Loading weights" not in printed and "not sharded" not in printed, printed
        assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()
        assert are_progress_bars_disabled("huggingface_hub.http_get")
    finally:
        enable_progress_bars()


def test_an_unlisted_file_a_load_would_read_is_refused_but_not_a_readme(tmp_path, tokenizer):
    """A file beside the listed ones passed verify_export unnoticed, although transformers loads some of them first:
    a model.safetensors copied into a sharded export wins over the listed shards. A file no load reads stays allowed
    (a model card, a hub download's .cache/)."""
    export = save_export(_model(), tmp_path / "hf", tokenizer)
    (export / "README.md").write_text("# my model")
    (export / ".cache" / "huggingface").mkdir(parents=True)
    (export / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("x")
    assert verify_export(export)
    for name in ("pytorch_model.bin", "model-00001-of-00002.safetensors", "added_tokens.json"):
        (export / name).write_bytes(b"stale")
        refusal = rf"hf/{re.escape(name)}: not listed in SHA256SUMS, but a load of the export may read it .*remove"
        with pytest.raises(ExportIntegrityError, match=refusal):
            load_model(export)
        (export / name).unlink()


def test_an_export_records_the_step_it_was_made_at(tmp_path, tokenizer):
    assert export_step(save_export(_model(), tmp_path / "a", tokenizer)) is None
    export = save_export(_model(), tmp_path / "b", tokenizer, step=12)
    assert json.loads((export / SOURCE).read_text()) == {"step": 12} and export_step(export) == 12
    assert SOURCE in (export / MANIFEST).read_text() and verify_export(export)
