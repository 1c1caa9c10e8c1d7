"""Bad input fails before any model work, naming what is wrong; training checkpoints go to `load_model`."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch

import klalm.eval.checkpoint as checkpoint_module
import klalm.eval.runner as runner
from klalm.config_checks import ConfigError
from klalm.eval import evaluate_checkpoints
from klalm.eval.checkpoint import checkpoint_kind, load_checkpoint
from klalm.eval.report import checkpoint_labels
from klalm.models.checkpoint import CheckpointError
from klalm.models.export import ExportIntegrityError


@pytest.fixture
def no_model_work(monkeypatch):
    """Fail the test if a checkpoint gets loaded."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input checks finished")

    monkeypatch.setattr(runner, "load_checkpoint", refuse)


def test_missing_checkpoint(tmp_path, shared_data, no_model_work):
    with pytest.raises(FileNotFoundError, match="nope.*does not exist"):
        evaluate_checkpoints([tmp_path / "nope"], ["piqa"], output_dir=tmp_path, data_dir=shared_data)


def test_folder_that_is_no_checkpoint(tmp_path, shared_data, no_model_work):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither config.json .* nor what a training run.s folder holds"):
        evaluate_checkpoints([tmp_path / "empty"], ["piqa"], output_dir=tmp_path, data_dir=shared_data)


def test_unknown_task_before_model_work(tiny_checkpoints, tmp_path, shared_data, no_model_work):
    with pytest.raises(KeyError, match="'hellaswag', 'piqa'"):
        evaluate_checkpoints([tiny_checkpoints[0]], ["piqa", "winogrande"], output_dir=tmp_path, data_dir=shared_data)


def test_data_dir_without_files(tiny_checkpoints, tmp_path, no_model_work):
    with pytest.raises(FileNotFoundError, match="hellaswag_val.jsonl"):
        evaluate_checkpoints([tiny_checkpoints[0]], ["hellaswag"], output_dir=tmp_path, data_dir=tmp_path)


def test_data_files_that_cannot_be_read(tiny_checkpoints, tmp_path, no_model_work):
    """A line that is not JSON, PIQA's labels not matching its rows, a cut .gz: refused naming the file before any
    model loads (each was a traceback from inside lm-eval after the first model had loaded)."""
    (tmp_path / "hellaswag").mkdir()
    (tmp_path / "hellaswag" / "hellaswag_val.jsonl").write_text('{"ind": 1}\n{"ind": \n')
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "valid.jsonl").write_text('{"goal": "g", "sol1": "a", "sol2": "b"}\n' * 3)
    (tmp_path / "piqa" / "valid-labels.lst").write_text("0\n1\n")
    cases = [
        ("hellaswag", r"^data_dir: task 'hellaswag' cannot read its data: .*hellaswag_val\.jsonl:2: not valid JSON"),
        ("piqa", r"^data_dir: task 'piqa' cannot read its data: .*valid\.jsonl has 3 rows but .*labels\.lst has 2"),
    ]
    for task, match in cases:
        with pytest.raises(ConfigError, match=match):
            evaluate_checkpoints([tiny_checkpoints[0]], [task], output_dir=tmp_path / "out", data_dir=tmp_path)
    (tmp_path / "hellaswag" / "hellaswag_val.jsonl").unlink()
    (tmp_path / "hellaswag" / "hellaswag_val.jsonl.gz").write_bytes(gzip.compress(b'{"ind": 1}\n' * 100)[:40])
    with pytest.raises(ConfigError, match=r"^data_dir: task 'hellaswag' cannot read its data: .*jsonl\.gz: Compressed"):
        evaluate_checkpoints([tiny_checkpoints[0]], ["hellaswag"], output_dir=tmp_path / "out", data_dir=tmp_path)


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"limit": 0}, ValueError, "limit"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"max_length": 0}, ValueError, "max_length must be positive"),
        ({"dtype": "float8"}, KeyError, "bfloat16"),
    ],
)
def test_bad_settings(tiny_checkpoints, tmp_path, shared_data, no_model_work, overrides, error, match):
    with pytest.raises(error, match=match):
        evaluate_checkpoints([tiny_checkpoints[0]], ["piqa"], output_dir=tmp_path, data_dir=shared_data, **overrides)


def test_every_checkpoint_and_the_output_folder_first(tiny_checkpoints, tmp_path, shared_data, no_model_work):
    """A bad second checkpoint, an output_dir that cannot be made or a missing tokenizer folder: refused before the
    first checkpoint is evaluated (it was after every evaluation, with nothing written)."""
    good = tiny_checkpoints[0]
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"garbage")
    changed = tmp_path / "changed"
    shutil.copytree(good, changed)
    (changed / "config.json").write_text((changed / "config.json").read_text() + " ")
    precious = tmp_path / "precious.txt"
    precious.write_text("keep")
    cases = [
        ([good, garbage], {}, CheckpointError, r"garbage\.ckpt cannot be read as a checkpoint"),
        ([good, changed], {}, ExportIntegrityError, r"changed/config\.json: sha256 differs"),
        ([good], {"output_dir": precious}, ConfigError, r"output_dir=.*precious\.txt' is a file, not a folder"),
        ([good], {"output_dir": precious / "sub"}, ConfigError, r"output_dir=.*precious\.txt/sub' cannot be created"),
        ([good], {"tokenizer": tmp_path / "nope"}, FileNotFoundError, r"tokenizer=.*nope': no such folder"),
    ]
    for checkpoints, given, error, match in cases:
        with pytest.raises(error, match=match):
            evaluate_checkpoints(
                checkpoints, ["piqa"], data_dir=shared_data, **{"output_dir": tmp_path / "out", **given}
            )
    assert precious.read_text() == "keep" and not (tmp_path / "out").exists()


def test_training_checkpoint_kinds(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step-00000010.ckpt").write_bytes(b"")
    assert checkpoint_kind(run) == "training"
    assert checkpoint_kind(run / "checkpoints" / "step-00000010.ckpt") == "training"
    (tmp_path / "run2" / "hf").mkdir(parents=True)
    (tmp_path / "run2" / "hf" / "config.json").write_text("{}")
    assert checkpoint_kind(tmp_path / "run2") == "training"
    assert checkpoint_kind(tmp_path / "run2" / "hf") == "hf_export"
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="not a Lightning .ckpt"):
        checkpoint_kind(tmp_path / "weights.bin")


def test_training_checkpoint_uses_train_loader(tmp_path, monkeypatch, gpt2_tokenizer):
    from klalm.models import build_model

    calls = []

    def fake_load_model(path):
        calls.append(path)
        return build_model("gpt", preset="tiny", vocab_size=len(gpt2_tokenizer)), gpt2_tokenizer

    monkeypatch.setattr(checkpoint_module, "load_model", fake_load_model)
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"")
    loaded = load_checkpoint(ckpt, device="cpu", dtype="float64")
    assert calls == [ckpt]
    assert loaded.provenance["kind"] == "training" and loaded.provenance["arch"] == "gpt"
    assert next(loaded.model.parameters()).dtype == torch.float64 and not loaded.model.training


def test_training_checkpoint_without_tokenizer(tmp_path, monkeypatch):
    # a synthetic-data run has no tokenizer
    monkeypatch.setattr(checkpoint_module, "load_model", lambda path: (torch.nn.Linear(1, 1), None))
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no tokenizer; pass tokenizer=FOLDER"):
        load_checkpoint(ckpt, device="cpu")


# A refusal raised once the app has begun costs a fresh interpreter that imports torch (~9 s); those of the same
# kind as another one here, with their message checked in-process, are `slow` (`make test-full`): dtype's KeyError
# line is task's (its message: test_bad_settings's dtype case), out-file's ConfigError refusal after the start is
# the light cases' line with device's and garbage-ckpt's cleanup (its message: test_every_checkpoint_and_the_output_
# folder_first).
@pytest.mark.parametrize(
    ("override", "line"),
    [
        pytest.param("tasks=[hellaswg]", "klalm-eval: tasks: no local task 'hellaswg'; valid: ['hellaswag', 'piqa']",
                     id="task"),
        pytest.param("dtype=foo",
                     "klalm-eval: dtype: unknown dtype 'foo'; valid: ['bfloat16', 'float16', 'float32', 'float64']",
                     id="dtype", marks=pytest.mark.slow),
        pytest.param("device=cuda:0",
                     "klalm-eval: device='cuda:0': torch sees no CUDA GPU here; use device=auto or cpu", id="device"),
        pytest.param("checkpoint={garbage}",
                     "klalm-eval: {garbage} cannot be read as a checkpoint (truncated or corrupted?)",
                     id="garbage-ckpt"),
        pytest.param("+limt=5", "klalm-eval: limt is not a klalm-eval key (did you mean limit?): nothing reads it",
                     id="typo-key"),
        pytest.param("device=gpu",
                     "klalm-eval: device='gpu' is invalid: must be auto, cpu, cuda, cuda:N (or mps, xpu, xpu:N)",
                     id="device-form"),
        pytest.param("max_length=0", "klalm-eval: max_length=0 is invalid: must be > 0", id="max-length"),
        pytest.param("output_dir=5", "klalm-eval: output_dir=5 is invalid: must be a string",
                     id="out-int"),  # was a TypeError traceback
        pytest.param("output_dir={garbage}", "klalm-eval: output_dir='{garbage}' is a file, not a folder",
                     id="out-file", marks=pytest.mark.slow),
    ],
)  # fmt: skip
def test_klalm_eval_refuses_bad_input_in_one_line(tiny_checkpoints, tmp_path, shared_data, override, line):
    """The console script's refusals: one line naming the key (or file), exit code 1, no traceback, and no run
    folder left behind (outputs/eval/<time>_<hex>, Hydra's .hydra/ and eval.log; nor outputs/, which it created)."""
    import subprocess
    import sys
    from pathlib import Path

    if override.startswith("device=cuda") and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_text("garbage\n")
    override, line = override.format(garbage=garbage), line.format(garbage=garbage)
    script = str(Path(sys.executable).parent / "klalm-eval")
    cmd = [script, f"checkpoint={tiny_checkpoints[0]}", f"data_dir={shared_data}", "limit=2", override]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(line)
    assert not (tmp_path / "outputs").exists()


def test_a_device_torch_cannot_use_here_is_refused_before_the_load(tiny_checkpoints, tmp_path, shared_data,
                                                                   no_model_work, monkeypatch):  # fmt: skip
    """device=mps where torch has no MPS backend, cuda:N beyond the GPUs torch sees: a RuntimeError traceback once the
    model had loaded (and the run folder left behind)."""
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for device, match in (
        ("mps", r"^device='mps': torch cannot use mps devices here; use device=auto or cpu$"),
        ("cuda:2", r"^device='cuda:2': torch sees 2 cuda device\(s\) here, cuda:0 to cuda:1$"),
    ):
        with pytest.raises(ConfigError, match=match):
            evaluate_checkpoints(
                [tiny_checkpoints[0]], ["piqa"], output_dir=tmp_path, data_dir=shared_data, device=device
            )


def test_a_checkpoint_that_fails_to_load_keeps_the_results_of_those_before_it(
    tiny_checkpoints, tmp_path, shared_data, monkeypatch
):
    """A failure the checks cannot see (here the second load) writes the first checkpoint's report, then raises."""
    loads = []

    def load_once(*args, **kwargs):
        loads.append(args[0])
        if len(loads) == 2:
            raise CheckpointError("cannot rebuild the second")
        return real_load(*args, **kwargs)

    real_load = runner.load_checkpoint
    monkeypatch.setattr(runner, "load_checkpoint", load_once)
    with pytest.raises(CheckpointError, match="second"):
        evaluate_checkpoints(tiny_checkpoints[:2], ["piqa"], output_dir=tmp_path, data_dir=shared_data, limit=2,
                             max_length=512, device="cpu")  # fmt: skip
    report = json.loads((tmp_path / "results.json").read_text())
    assert len(loads) == 2 and list(report["results"]) == checkpoint_labels(tiny_checkpoints[:2])[:1]
    assert (tmp_path / "results.md").is_file()


@pytest.mark.parametrize(
    ("line", "reason"),
    [('{"sol1": "a", "sol2": "b"}', "a row has no field 'goal'"), ('["g", "a", "b"]', "a row is not a JSON object")],
)
def test_piqa_rows_of_another_shape_are_refused_naming_the_file(tmp_path, line, reason):
    """A PIQA row without "goal" (KeyError) or a line that is a list (TypeError) was a traceback."""
    from klalm.eval.harness import check_local_rows

    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "valid.jsonl").write_text(line + "\n")
    (tmp_path / "piqa" / "valid-labels.lst").write_text("0\n")
    files = [tmp_path / "piqa" / "valid.jsonl", tmp_path / "piqa" / "valid-labels.lst"]
    with pytest.raises(ConfigError, match=rf"^data_dir: task 'piqa' cannot read its data: .*valid\.jsonl.*: {reason}"):
        check_local_rows("piqa", tmp_path, files)


def test_a_hub_tokenizer_id_the_cache_cannot_load_still_asks_the_hub(monkeypatch):
    """The cached attempt (local_files_only) raised a ValueError past the hub check, unlike the second load."""
    import transformers

    def from_pretrained(*args, **kwargs):
        raise ValueError("Unrecognized tokenizer")

    def check_hub(what, hint):
        raise FileNotFoundError(f"{what}: the hub cannot be reached")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setattr(checkpoint_module, "check_hub", check_hub)
    with pytest.raises(FileNotFoundError, match="the hub cannot be reached"):
        checkpoint_module._tokenizer_from(Path("org/tokenizer"))
