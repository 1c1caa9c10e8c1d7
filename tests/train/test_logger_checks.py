"""An online wandb logger without credentials is refused at the start, in one line, before anything is built (it
was wandb's traceback from inside `trainer.fit`, after the data and the model)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from klalm.config_checks import ConfigError
from klalm.train.app import check_wandb_credentials

from .conftest import compose_train

ONLINE = ["experiment=smoke", "logger=wandb", "logger.wandb.offline=false"]
KEY = "k" * 40  # a well-formed key (never sent: nothing here goes online)
REFUSAL = (
    "klalm-train: logger.wandb.offline=false needs wandb credentials: set WANDB_API_KEY or run `wandb login`, or keep "
    "logger.wandb.offline=true (sync later with `wandb sync`)"
)


def _without_credentials(home: Path) -> dict[str, str]:
    """The environment with no wandb variable, no NETRC and `home` as HOME (no ~/.netrc, no wandb settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    return {**env, "HOME": str(home)}


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    """This process without wandb credentials; wandb's settings, which it loads once per process, are reloaded."""
    wandb = pytest.importorskip("wandb")
    home = tmp_path / "home"
    home.mkdir()
    for name in [k for k in os.environ if k.startswith("WANDB_")] + ["NETRC"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    wandb.teardown()
    yield home
    wandb.teardown()


def test_online_wandb_without_credentials_is_refused_in_one_line_and_leaves_no_folder(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    code = textwrap.dedent(f"""
        import sys
        sys.argv = {["klalm-train", *ONLINE, "run_name=r", f"paths.log_dir={tmp_path / 'out'}"]!r}
        from klalm import cli
        cli.train()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=_without_credentials(home), stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == REFUSAL
    assert "Traceback" not in proc.stderr and "wandb" not in proc.stdout
    assert not (tmp_path / "out" / "r").exists()
    assert not (home / ".cache" / "klalm").exists()  # refused before the data (corpus, tokenizer) was prepared


def test_the_check_refuses_only_an_online_wandb_logger_without_a_key(no_credentials, monkeypatch):
    with pytest.raises(ConfigError, match=r"^logger\.wandb\.offline=false needs wandb credentials: set WANDB_API_KEY"):
        check_wandb_credentials(compose_train(ONLINE))
    check_wandb_credentials(compose_train(["experiment=smoke", "logger=wandb"]))  # offline: the default
    check_wandb_credentials(compose_train(["experiment=smoke", "logger=all"]))
    check_wandb_credentials(compose_train(["experiment=smoke", "logger=csv"]))
    check_wandb_credentials(compose_train([*ONLINE, "+logger.wandb.mode=offline"]))  # wandb.init(mode=...)


@pytest.mark.parametrize("mode", ["offline", "disabled", "dryrun"])
def test_wandb_mode_in_the_environment_leaves_nothing_to_refuse(no_credentials, monkeypatch, mode):
    """wandb obeys WANDB_MODE over WandbLogger(offline=False), which passes no mode: no login, nothing to refuse."""
    monkeypatch.setenv("WANDB_MODE", mode)
    check_wandb_credentials(compose_train(ONLINE))


def test_a_key_in_the_environment_passes(no_credentials, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    check_wandb_credentials(compose_train(ONLINE))


@pytest.mark.parametrize("host", ["api.wandb.ai", "api.forge.coreweave.com"])
def test_a_key_in_the_netrc_file_passes(no_credentials, host):
    """`wandb login` writes ~/.netrc; an older wandb wrote it for api.wandb.ai, which a newer one still reads."""
    netrc = no_credentials / ".netrc"
    netrc.write_text(f"machine {host}\n  login user\n  password {KEY}\n")
    netrc.chmod(0o600)
    check_wandb_credentials(compose_train(ONLINE))


def test_a_key_in_a_netrc_file_named_by_netrc_passes(no_credentials, tmp_path, monkeypatch):
    netrc = tmp_path / "credentials"
    netrc.write_text(f"machine api.wandb.ai login user password {KEY}\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    check_wandb_credentials(compose_train(ONLINE))


def test_an_invalid_key_is_refused_with_wandbs_reason(no_credentials, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "abc")
    with pytest.raises(ConfigError, match=r"^logger\.wandb: WANDB_API_KEY invalid: "):
        check_wandb_credentials(compose_train(ONLINE))
