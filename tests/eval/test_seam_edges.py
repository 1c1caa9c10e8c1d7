"""The checkpoint → evaluation seam on bad input: `klalm.eval.checkpoint.load_checkpoint` (what klalm-eval loads)
and `klalm-lm-eval`'s checks before lm-eval runs, each refusal one line naming the path, flag or file."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from klalm.config_checks import ConfigError
from klalm.data.tokenizer import train_bpe_tokenizer
from klalm.eval.checkpoint import check_checkpoint, load_checkpoint
from klalm.eval.harness import check_run_args
from klalm.eval.tasks import TASKS_DIR
from klalm.models import build_model
from klalm.models.checkpoint import CheckpointError
from klalm.models.export import MANIFEST, SOURCE, ExportIntegrityError, save_export, write_manifest

VOCAB = 300


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A tiny kla export with its own 300-token BPE, inside a run-like folder (<root>/run/hf)."""
    texts = [f"line {i}: the state is predicted, then corrected." for i in range(200)]
    tokenizer = train_bpe_tokenizer(texts, VOCAB, tmp_path_factory.mktemp("tok"))
    torch.manual_seed(0)
    model = build_model("kla", vocab_size=VOCAB, d_model=32, n_layers=1, d_ff=64).eval()
    return save_export(model, tmp_path_factory.mktemp("root") / "run" / "hf", tokenizer, max_length=32)


def test_a_garbage_ckpt_is_one_checkpoint_error(tmp_path):
    """A few bytes named .ckpt: torch.load raised KeyError (a traceback out of klalm-eval)."""
    path = tmp_path / "step-00000001.ckpt"
    path.write_bytes(b"hello")
    with pytest.raises(CheckpointError, match=r"step-00000001\.ckpt cannot be") as info:
        load_checkpoint(path, device="cpu")
    assert "\n" not in str(info.value)


def test_a_tokenizer_larger_than_the_embedding_is_refused(export, shared_data):
    """GPT-2's 50,257 tokens on a 300-token model: an IndexError in the middle of a task before."""
    with pytest.raises(
        ConfigError, match=r"tokenizer=.*gpt2_tokenizer has 50,257 tokens but the model's embedding has"
    ):
        load_checkpoint(export, tokenizer=shared_data / "gpt2_tokenizer", device="cpu")


def test_a_hub_tokenizer_where_the_hub_cannot_be_reached_is_refused_at_once(export, monkeypatch):
    """tokenizer=<hub id> not in the cache, offline: one line at once (it was ~50 s of the hub's retries)."""
    import socket
    import time

    from huggingface_hub import constants

    def no_dns(host, *args, **kwargs):  # no real lookup
        raise socket.gaierror(-2, "Name or service not known")

    for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(constants, "ENDPOINT", "https://huggingface.co")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    started = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"^tokenizer=no-such-tokenizer needs the Hugging Face hub, which "
                                                r"cannot be reached \(huggingface\.co does not resolve"):  # fmt: skip
        load_checkpoint(export, tokenizer="no-such-tokenizer", device="cpu")
    assert time.monotonic() - started < 10


def test_a_run_folder_loads_its_export_through_the_strict_loader(export, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(export.parent, run)
    (run / "hf" / MANIFEST).unlink()
    config = json.loads((run / "hf" / "config.json").read_text())
    (run / "hf" / "config.json").write_text(json.dumps({**config, "arch": "mamba"}))
    with pytest.raises(ExportIntegrityError, match=r"hf: its weights do not fit its config\.json \(arch 'mamba'\)"):
        load_checkpoint(run, device="cpu")
    loaded = load_checkpoint(export.parent, device="cpu")
    assert loaded.provenance["arch"] == "kla" and loaded.provenance["kind"] == "training"


def test_check_checkpoint_refuses_what_the_load_would_without_building_a_model(export, tmp_path):
    """klalm-eval checks every checkpoint first: a run folder's export whose config.json is not JSON (no SHA256SUMS
    to catch it), or a run folder whose only .ckpt is garbage, was refused only when its turn came."""
    assert check_checkpoint(export) == "hf_export" and check_checkpoint(export.parent) == "training"
    run = tmp_path / "run"
    shutil.copytree(export.parent, run)
    (run / "hf" / MANIFEST).unlink()
    (run / "hf" / "config.json").write_text("{not json")
    with pytest.raises(ExportIntegrityError, match=r"hf/config\.json cannot be read as JSON"):
        check_checkpoint(run)
    (tmp_path / "run2" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run2" / "checkpoints" / "step-00000001.ckpt").write_bytes(b"hello")
    with pytest.raises(FileNotFoundError, match=r"run2 has no hf/ export and no valid .*step-00000001\.ckpt cannot"):
        check_checkpoint(tmp_path / "run2")


def _run_with_checkpoint(export: Path, tmp_path: Path, step: int) -> tuple[Path, Path]:
    """A copy of the export's run folder with a checkpoint of `step` written a minute after the export (only the
    checkpoint's name and time are read): (the run folder, the checkpoint)."""
    run = tmp_path / "run"
    shutil.copytree(export.parent, run)
    (run / "checkpoints").mkdir()
    checkpoint = run / "checkpoints" / f"step-{step:08d}.ckpt"
    checkpoint.write_bytes(b"not read")
    written = (run / "hf" / MANIFEST).stat().st_mtime
    os.utime(checkpoint, (written + 60, written + 60))
    return run, checkpoint


def test_a_run_folder_whose_checkpoints_go_beyond_its_export_is_refused(export, tmp_path):
    """A run resumed after its export writes checkpoints beyond it until it exports again: klalm-eval (and
    klalm-generate, load_model) of the run folder scored the older export without a word. The step an export records
    decides; an export that records none, in a run folder without a summary.json, is compared by modification time."""
    run, later = _run_with_checkpoint(export, tmp_path, 5)
    written = (run / "hf" / MANIFEST).stat().st_mtime
    tail = (
        ": name the one to load by its path, or finish the run to export it again (klalm-train with the run's "
        f"overrides and resume={run})"
    )
    stale = (
        f"{run}/hf was written before the run's checkpoint {later} (by modification time: neither the export nor the "
        f"run's summary.json records the step it was made at){tail}"
    )
    for check in (check_checkpoint, lambda path: load_checkpoint(path, device="cpu")):
        with pytest.raises(CheckpointError, match=f"^{re.escape(stale)}$"):
            check(run)
    assert check_checkpoint(run / "hf") == "hf_export"  # named by its path, the export itself loads
    os.utime(later, (written - 60, written - 60))
    assert check_checkpoint(run) == "training"
    (run / "hf" / SOURCE).write_text('{"step": 5}')
    write_manifest(run / "hf")
    os.utime(later, (written + 60, written + 60))  # the recorded step decides, not the time
    assert check_checkpoint(run) == "training"
    beyond = later.rename(later.with_name("step-00000007.ckpt"))
    stale = (
        f"{run}/hf holds the weights of step 5 (its source.json), but the run has the later checkpoint {beyond}{tail}"
    )
    with pytest.raises(CheckpointError, match=f"^{re.escape(stale)}$"):
        check_checkpoint(run)


def test_an_export_without_a_step_is_dated_by_the_runs_summary_not_by_modification_times(export, tmp_path):
    """An export made before exports recorded their step was dated by modification times only: a run folder copied
    without them (`cp -r` may write the final checkpoint after the export) was refused. The step in the run's
    summary.json, which the finishing start writes after its export, now decides; the times only without it, and the
    line says which of them did."""
    run, final = _run_with_checkpoint(export, tmp_path, 5)  # copied after the export
    (run / "summary.json").write_text(json.dumps({"steps": 5, "tokens_seen": 640}))
    assert check_checkpoint(run) == "training"
    beyond = final.rename(final.with_name("step-00000007.ckpt"))  # resumed for more steps, stopped before the export
    stale = (
        f"{run}/hf records no step, and the run's summary.json ends at step 5 (where it exported), but the run has the "
        f"later checkpoint {beyond}: name the one to load by its path"
    )
    with pytest.raises(CheckpointError, match=f"^{re.escape(stale)}"):
        check_checkpoint(run)
    (run / "summary.json").write_text('{"steps": "7"}')  # no whole number: the times decide
    stale = f"{run}/hf was written before the run's checkpoint {beyond} (by modification time: neither the export "
    with pytest.raises(CheckpointError, match=f"^{re.escape(stale)}"):
        check_checkpoint(run)


def test_the_summary_of_a_start_that_did_not_export_dates_no_export(export, tmp_path):
    """A start stopped by a SIGTERM before its export (or run with train.export_hf=false) still writes its summary, at
    its last step: an earlier start's export that records no step was then dated by that step and passed as current,
    and the older weights were scored for the run's. Such a summary says `"exported": false` and dates no export."""
    run, final = _run_with_checkpoint(export, tmp_path, 7)
    (run / "summary.json").write_text(json.dumps({"steps": 7, "exported": False}))
    stale = f"{run}/hf was written before the run's checkpoint {final} (by modification time: neither the export "
    with pytest.raises(CheckpointError, match=f"^{re.escape(stale)}"):
        check_checkpoint(run)
    (run / "summary.json").write_text(json.dumps({"steps": 7, "exported": True}))  # (then the export records step 7)
    assert check_checkpoint(run) == "training"


def test_a_runs_checkpoints_folder_is_refused_naming_the_run_folder(tmp_path):
    """checkpoint=<run>/checkpoints (klalm-eval, klalm-generate) said the folder had "no valid checkpoints/step-*.ckpt"
    while it held them."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step-00000001.ckpt").write_bytes(b"hello")
    message = f"{run}/checkpoints is a run's checkpoints/ folder: name the run folder {run} or one of the .ckpt files"
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(message)}$"):
        check_checkpoint(run / "checkpoints")


def _run_args(pretrained: str | None = None, tasks=("piqa_local",), include=str(TASKS_DIR), metadata=None):
    model_args = {} if pretrained is None else {"pretrained": pretrained}
    return argparse.Namespace(
        model="hf", model_args=model_args, tasks=list(tasks), include_path=include, metadata=metadata
    )


def test_lm_eval_checks_a_local_pretrained_path(export, tmp_path, shared_data):
    meta = {"data_dir": str(shared_data)}
    check_run_args(_run_args(str(export), metadata=meta))  # a good export
    check_run_args(_run_args("gpt2", tasks=["hellaswag"]))  # a hub id is lm-eval's business
    cases = {
        str(tmp_path / "nope"): r"pretrained=.*nope: no such folder",
        str(export / "model.safetensors"): r"model\.safetensors is a file; .*klalm-eval checkpoint=FILE",
        str(export.parent): rf"is a training run folder: its export is pretrained={export}$",
        str(tmp_path): r"holds no config\.json: not a Hugging Face export folder",
    }
    for value, message in cases.items():
        with pytest.raises(FileNotFoundError, match=message):
            check_run_args(_run_args(value, metadata=meta))
    changed = tmp_path / "changed"
    shutil.copytree(export, changed)
    (changed / "config.json").write_text((changed / "config.json").read_text() + " ")
    with pytest.raises(ExportIntegrityError, match=r"config\.json: sha256 differs"):
        check_run_args(_run_args(str(changed), metadata=meta))


def test_lm_eval_checks_the_local_tasks(tmp_path, shared_data):
    with pytest.raises(ConfigError, match=r"--tasks piqa_local: klalm's local tasks need --include_path"):
        check_run_args(_run_args(include=None, metadata={"data_dir": str(shared_data)}))
    with pytest.raises(ConfigError, match=r"pass --metadata '\{\"data_dir\": "):
        check_run_args(_run_args(tasks=["hellaswag_local", "arc_easy"]))
    with pytest.raises(FileNotFoundError, match=r"--metadata data_dir: task 'piqa_local' needs .*piqa/valid\.jsonl"):
        check_run_args(_run_args(metadata={"data_dir": str(tmp_path)}))
    check_run_args(_run_args(tasks=["arc_easy"], include=None))  # no local task: nothing to check
    (tmp_path / "piqa").mkdir()  # PIQA's labels not matching its rows: a traceback from inside lm-eval after the load
    (tmp_path / "piqa" / "valid.jsonl").write_text('{"goal": "g", "sol1": "a", "sol2": "b"}\n' * 2)
    (tmp_path / "piqa" / "valid-labels.lst").write_text("0\n")
    with pytest.raises(ConfigError, match=r"^--metadata data_dir: task 'piqa' cannot read its data: .*2 rows but"):
        check_run_args(_run_args(metadata={"data_dir": str(tmp_path)}))
    given = _run_args(include=None)
    given.config = "run.yaml"  # a --config file may give the include path and metadata: lm-eval checks those
    check_run_args(given)


def test_lm_eval_takes_a_relative_path_with_folders_as_a_path(tmp_path):
    """outputs/smoke/<typo>/hf (the documented form, mistyped) is no hub id ("org/name" has one "/"): it was handed
    to lm-eval, which ended in a traceback."""
    with pytest.raises(FileNotFoundError, match=r"pretrained=outputs/smoke/typo/hf: no such folder"):
        check_run_args(_run_args("outputs/smoke/typo/hf", tasks=["arc_easy"]))
    check_run_args(_run_args("EleutherAI/pythia-70m", tasks=["arc_easy"]))  # a hub id: lm-eval's business


def test_klalm_lm_eval_refuses_in_one_line(tmp_path, monkeypatch):
    """The console script: a missing export folder was a transformers traceback (an OSError about repo ids). Its
    function in this process (as tests/eval/test_harness.py's refusals): sys.exit with the one line, which Python
    prints with exit code 1; a fresh interpreter spent ~10 s importing torch and lm-eval."""
    from klalm.cli import lm_eval

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["run", "--model", "hf", "--model_args", f"pretrained={tmp_path / 'nope'}", "--tasks", "piqa_local"]
    monkeypatch.setattr(sys, "argv", ["klalm-lm-eval", *args])
    with pytest.raises(SystemExit) as refused:
        lm_eval()
    assert refused.value.code == f"klalm-lm-eval: --model_args pretrained={tmp_path / 'nope'}: no such folder"
