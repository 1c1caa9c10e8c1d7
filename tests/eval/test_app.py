"""The `klalm-eval` Hydra app and the `klalm-lm-eval` console script."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from klalm.cli import evaluate
from klalm.eval import app
from klalm.eval.tasks import TASKS_DIR
from klalm.train.rundir import fresh_run_name

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _refusal(monkeypatch, argv: list[str]) -> str:
    """What `klalm-eval` with `argv` exits with: its one-line refusal."""
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        evaluate()
    return exit_info.value.code


def _script(name: str) -> str:
    """A console script of this environment (next to the running interpreter)."""
    return str(Path(sys.executable).parent / name)


def test_compose_and_run(tiny_checkpoints, shared_data, tmp_path):
    overrides = [
        f"checkpoint={tiny_checkpoints[0]}",
        "tasks=[piqa]",
        f"data_dir={shared_data}",
        "limit=3",
        "batch_size=2",
        "device=cpu",
        f"output_dir={tmp_path}",
    ]
    with initialize_config_module("klalm.configs", version_base="1.3"):
        cfg = compose(config_name="eval", overrides=overrides)
    report = app.run(cfg)
    assert report["results"]["export"]["piqa"]["n_evaluated"] == 3
    assert json.loads((tmp_path / "results.json").read_text())["settings"]["batch_size"] == 2


def test_defaults_and_unknown_key():
    with initialize_config_module("klalm.configs", version_base="1.3"):
        cfg = compose(config_name="eval")
        assert list(cfg.tasks) == ["hellaswag", "piqa"] and cfg.data_dir is None and cfg.limit is None
        with pytest.raises(Exception, match="no_such_key"):
            compose(config_name="eval", overrides=["no_such_key=1"])


def test_main_parses_command_line(tmp_path, monkeypatch, capsys):
    """The real @hydra.main entry in-process: `tasks=[...]` is a plain key (no config group shadows it)."""
    missing = tmp_path / "missing"
    argv = ["klalm-eval", f"checkpoint={missing}", "tasks=[piqa]", "limit=2", f"hydra.run.dir={tmp_path}"]
    assert _refusal(monkeypatch, argv) == f"klalm-eval: checkpoint {str(missing)!r} does not exist"


def test_output_dir_holds_the_log_and_the_config_record(tiny_checkpoints, shared_data, tmp_path, monkeypatch, capsys):
    """output_dir=X: eval.log and Hydra's config record go to X with the results (they went to a second folder,
    outputs/eval/<time>_<hex> in the working directory). A second evaluation into X keeps the first one's record and
    writes its own beside it, and the first one's samples go with its results (they stayed beside the second's
    results, which do not describe them); a refused one leaves no folder it created."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "ev"
    argv = ["klalm-eval", f"checkpoint={tiny_checkpoints[0]}", "tasks=[piqa]", f"data_dir={shared_data}", "device=cpu",
            "max_length=512", f"output_dir={out}"]  # fmt: skip
    for limit, log_samples in ((2, "true"), (3, "false")):
        monkeypatch.setattr(sys, "argv", [*argv, f"limit={limit}", f"log_samples={log_samples}"])
        evaluate()
        assert (out / "samples_export_piqa.jsonl").is_file() == (log_samples == "true")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev"]  # no outputs/
    assert sorted(p.name for p in out.iterdir()) == [".hydra", "eval.log", "results.json", "results.md"]
    assert (out / "eval.log").read_text().count("wrote ") == 2
    assert "limit: 2" in (out / ".hydra" / "config.yaml").read_text()
    [second] = (out / ".hydra").glob("eval-*/config.yaml")
    assert "limit: 3" in second.read_text()

    monkeypatch.setattr(sys, "argv", ["klalm-eval", f"checkpoint={tmp_path / 'missing'}", f"output_dir={out}/a/b"])
    with pytest.raises(SystemExit, match="does not exist"):
        evaluate()
    assert not (out / "a").exists()
    # refused into X itself: X keeps both earlier records and no third (its eval.log keeps the refusal's lines)
    fresh_run_name.cache_clear()  # a new name, as a new process has
    monkeypatch.setattr(sys, "argv", ["klalm-eval", f"checkpoint={tmp_path / 'missing'}", f"output_dir={out}"])
    with pytest.raises(SystemExit, match="does not exist"):
        evaluate()
    assert len(list((out / ".hydra").glob("eval-*"))) == 1 and (out / ".hydra" / "config.yaml").is_file()
    monkeypatch.setattr(sys, "argv", ["klalm-eval", f"checkpoint={tmp_path / 'missing'}", "output_dir= "])
    with pytest.raises(SystemExit, match="output_dir"):  # an empty one wrote into the working directory
        evaluate()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev"]


def test_a_comma_separated_value_is_refused_in_one_line_naming_the_key(tmp_path, monkeypatch):
    """`checkpoint=a,b` (a list meant) without --multirun: Hydra's five lines on being "ambiguous", which named no
    key of klalm-eval's and offered a sweep; one line naming the override and how to write a list or a text."""
    monkeypatch.chdir(tmp_path)
    assert _refusal(monkeypatch, ["klalm-eval", "checkpoint=runs/a/hf,runs/b/hf", "tasks=[piqa]"]) == (
        "klalm-eval: checkpoint=runs/a/hf,runs/b/hf: Hydra reads a comma outside brackets and quotes as a sweep over "
        "values; a list is written 'checkpoint=[runs/a/hf,runs/b/hf]', a text with commas "
        """checkpoint='"runs/a/hf,runs/b/hf"'"""
    )
    assert list(tmp_path.iterdir()) == []


def test_main_refuses_the_hub_tasks_at_once_when_the_hub_cannot_be_reached(tiny_checkpoints, tmp_path, monkeypatch):
    """No data_dir and a hub name that does not resolve: one line before any model loads, not lm-eval's retries and
    traceback after the first one."""
    import datasets.config
    from huggingface_hub import constants

    import klalm.eval.runner as runner

    def no_dns(host, *args, **kwargs):  # no real lookup
        raise socket.gaierror(-2, "Name or service not known")

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the hub was found unreachable")

    for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(constants, "ENDPOINT", "https://huggingface.co")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # an offline mode set would leave it to lm-eval
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(runner, "load_checkpoint", no_load)
    argv = ["klalm-eval", f"checkpoint={tiny_checkpoints[0]}", "tasks=[piqa]", "limit=2", f"hydra.run.dir={tmp_path}"]
    assert _refusal(monkeypatch, argv) == (
        "klalm-eval: evaluating the hub tasks ['piqa'] needs the Hugging Face hub, which cannot be reached "
        "(huggingface.co does not resolve: Name or service not known): give data_dir (a local data folder) for the "
        "offline local tasks, or set HF_HUB_OFFLINE=1 to use their datasets from the Hugging Face cache"
    )


def test_main_refuses_an_unknown_hub_task_in_one_line(tiny_checkpoints, tmp_path, monkeypatch):
    """No data_dir and a task lm-eval does not have: one line with the closest names, before any model loads, and
    no folder left (it was a KeyError traceback, and outputs/eval/... stayed with its eval.log)."""
    import lm_eval.tasks
    from huggingface_hub import constants

    import klalm.eval.runner as runner

    class Index:  # lm-eval's TaskManager without indexing its ~14,700 task files
        all_tasks, task_index = ["piqa", "hellaswag"], {}

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the task names were checked")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the hub tasks' datasets from the cache: no hub check
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Index)
    monkeypatch.setattr(runner, "load_checkpoint", no_load)
    out = tmp_path / "ev"
    argv = ["klalm-eval", f"checkpoint={tiny_checkpoints[0]}", "tasks=[piqaa]", f"output_dir={out}"]
    assert _refusal(monkeypatch, argv) == (
        "klalm-eval: tasks: lm-eval has no task 'piqaa' (closest: ['piqa']; `lm-eval ls tasks` lists all 2); "
        "with data_dir the local tasks are ['hellaswag', 'piqa']"
    )
    assert not out.exists()


def test_main_refuses_an_export_whose_weights_changed(tiny_checkpoints, tmp_path, monkeypatch, capsys):
    copy = tmp_path / "export"
    copy.mkdir()
    for path in tiny_checkpoints[0].iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)  # 4 KB zeroed in the middle
    weights.write_bytes(bytes(data))
    argv = ["klalm-eval", f"checkpoint={copy}", "tasks=[piqa]", f"hydra.run.dir={tmp_path}"]
    assert _refusal(monkeypatch, argv) == (
        f"klalm-eval: {weights}: sha256 differs from SHA256SUMS (the file changed or is corrupt since export); "
        "refusing to load the export"
    )


@pytest.mark.slow  # a fresh interpreter importing torch, transformers and lm-eval: ~10-25 s on 2 cores
def test_console_script_reports_missing_checkpoint(tmp_path):
    missing = tmp_path / "missing"
    proc = subprocess.run(
        [_script("klalm-eval"), f"checkpoint={missing}", "tasks=[piqa]", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert proc.returncode != 0
    assert f"checkpoint {str(missing)!r} does not exist" in proc.stderr


@pytest.mark.slow
def test_lm_eval_cli_loads_klalm_export(tiny_checkpoints, shared_data, tmp_path):
    """lm-eval's own CLI (through klalm-lm-eval) evaluates a klalm export on the local PIQA task."""
    cmd = [
        _script("klalm-lm-eval"), "run", "--model", "hf", "--model_args", f"pretrained={tiny_checkpoints[0]}",
        "--tasks", "piqa_local", "--include_path", str(TASKS_DIR),
        "--metadata", json.dumps({"data_dir": str(shared_data)}),
        "--limit", "3", "--device", "cpu", "--batch_size", "3", "--output_path", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "piqa_local" in proc.stdout and "acc_norm" in proc.stdout


@pytest.mark.slow  # lm-eval's CLI in a fresh interpreter: ~20-40 s on 2 cores
def test_plain_lm_eval_loads_the_export_with_trust_remote_code(tiny_checkpoints, shared_data, tmp_path):
    """The README's line: lm-eval itself (no klalm import in its code), the local task folder from klalm-eval."""
    tasks_dir = subprocess.run(
        [_script("klalm-eval"), "--print-tasks-path"], capture_output=True, text=True, check=True
    )
    cmd = [
        sys.executable, "-m", "lm_eval", "run", "--model", "hf",
        "--model_args", f"pretrained={tiny_checkpoints[0]},trust_remote_code=True",
        "--tasks", "piqa_local", "--include_path", tasks_dir.stdout.strip(),
        "--metadata", json.dumps({"data_dir": str(shared_data)}),
        "--limit", "3", "--device", "cpu", "--batch_size", "3", "--output_path", str(tmp_path),
    ]  # fmt: skip
    env = {**ENV, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "piqa_local" in proc.stdout and "acc_norm" in proc.stdout


def test_the_default_output_folder_carries_random_digits():
    """The default output folder is `<time>_<6 hex digits>` (`fresh_run_name`, one per process, as training's run
    folders): two evaluations started in the same second used to share `outputs/eval/<date>/<time>`."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    import klalm.configs  # noqa: F401  (registers the resolvers)

    with initialize_config_module("klalm.configs", version_base="1.3"):
        folder = OmegaConf.select(compose("eval", return_hydra_config=True), "hydra.run.dir")
    assert re.fullmatch(r"outputs/eval/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_[0-9a-f]{6}", folder)  # one per process
