"""Checkpoints load with weights_only=True everywhere: a `.ckpt` whose pickle calls a function never runs it.

The planted payload writes a marker file when unpickled by the full (unsafe) unpickler; `klalm-eval`,
`klalm-train resume=...` and `load_model` must refuse the file, say it is not a trusted klalm checkpoint, and leave
no marker.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from klalm.models.checkpoint import CheckpointError, find_latest, load_checkpoint_file, load_model

from .conftest import RUN_ENV, TINY, compose_train

NOT_TRUSTED = "not a trusted klalm checkpoint"


def _script(name: str) -> str:
    """The console script `name` of the environment running the tests."""
    return str(Path(sys.executable).parent / name)


class _Payload:
    """Unpickles into a call of os.system: what an attacker's checkpoint would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def evil(tmp_path):
    """(a .ckpt with the payload inside a klalm-looking checkpoint, the marker file it would create)."""
    marker = tmp_path / "payload-ran"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "klalm": {"rng": _Payload(marker)}}, path)
    return path, marker


def test_the_payload_is_live(evil):
    """The fixture is a real attack: the unsafe loader runs it (so the refusals below are meaningful)."""
    path, marker = evil
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_load_model_refuses_the_payload(evil):
    path, marker = evil
    with pytest.raises(CheckpointError, match=NOT_TRUSTED) as info:
        load_model(path)
    assert "system" in str(info.value) and "\n" not in str(info.value)  # names what it refused, on one line
    assert not marker.exists()


def test_klalm_eval_refuses_the_payload(evil, tmp_path, shared_data):
    path, marker = evil
    cmd = [_script("klalm-eval"), f"checkpoint={path}", "tasks=[piqa]", f"data_dir={shared_data}", "limit=2",
           "device=cpu", f"hydra.run.dir={tmp_path / 'eval'}"]  # fmt: skip
    proc = subprocess.run(cmd, env=RUN_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert NOT_TRUSTED in proc.stderr + proc.stdout
    assert not marker.exists()


def test_klalm_train_resume_refuses_the_payload(evil, tmp_path):
    path, marker = evil
    cmd = [_script("klalm-train"), *TINY, f"resume={path}", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, env=RUN_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert NOT_TRUSTED in proc.stderr
    assert not marker.exists()


def test_written_checkpoints_load_safely(tmp_path):
    """What klalm-train writes (RNG states, loader state, model config) passes the safe loader as it is."""
    from klalm.train.app import run

    run_dir = tmp_path / "run"
    run(compose_train([*TINY, "callbacks=default", "callbacks.sampler=null", "callbacks.progress=null"], run_dir))
    checkpoint = torch.load(find_latest([run_dir]), map_location="cpu", weights_only=True)
    assert {"state_dict", "optimizer_states", "klalm"} <= checkpoint.keys()
    assert load_checkpoint_file(find_latest([run_dir]))["global_step"] == 4


@pytest.mark.parametrize("content", [b"garbage\n", b"PK\x03\x04 a zip cut short"], ids=["text", "truncated-zip"])
@pytest.mark.parametrize("mmap", [False, True])
def test_a_file_that_is_no_checkpoint_is_called_unreadable_not_untrusted(tmp_path, content, mmap):
    """Garbage (or a zip cut short) fails the safe unpickler too, but it names no code to refuse: the message says
    the file cannot be read, not that it came from elsewhere (`klalm-eval` loads without mmap, a resume with it)."""
    path = tmp_path / "garbage.ckpt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="cannot be read as a checkpoint") as info:
        load_checkpoint_file(path, mmap=mmap)
    assert NOT_TRUSTED not in str(info.value)


def test_an_old_style_pickle_with_code_in_it_is_still_untrusted(tmp_path):
    """A bare (pre-zip) pickle that calls a function: its names cannot be listed safely, but it is refused as
    untrusted, not as unreadable."""
    marker, path = tmp_path / "payload-ran", tmp_path / "old.ckpt"
    torch.save({"state_dict": {}, "klalm": {"rng": _Payload(marker)}}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=NOT_TRUSTED):
        load_checkpoint_file(path)
    assert not marker.exists()
