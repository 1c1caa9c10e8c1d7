"""Every experiment composes with train.yaml, and every group file instantiates (Hydra struct mode on)."""

from __future__ import annotations

import inspect
from pathlib import Path

import hydra
import lightning.pytorch as pl
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import klalm.train.app  # noqa: F401  (registers the config resolvers)
from klalm.config_checks import resolve_target

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
ARCH_SIZES = [f"{a}_{s}" for a in ("kla", "gpt", "mamba", "gdn", "gpt_kla") for s in ("45m", "180m")]


def _files(group: str) -> list[str]:
    """The options of a group a user picks (files named `_*` are the shared parts the options compose)."""
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml") if not p.stem.startswith("_"))


@pytest.fixture(scope="module", autouse=True)
def _hydra():
    """One Hydra context for the whole module (initialising it per test costs seconds on a loaded machine)."""
    with initialize_config_module("klalm.configs", version_base="1.3"):
        yield


def _compose(overrides: list[str]):
    return compose("train", overrides=[*overrides, "paths.run_dir=/tmp/klalm-test-configs"])


def test_one_experiment_per_arch_and_size():
    assert set(ARCH_SIZES) <= set(EXPERIMENTS)
    assert {"smoke", "offline", "bench"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_resolves(experiment):
    cfg = _compose([f"experiment={experiment}"])
    OmegaConf.resolve(cfg)  # every interpolation resolves (paths, resolvers, ${..} references)
    for key in ("model", "data", "trainer", "optim", "scheduler", "train", "callbacks", "logger"):
        assert key in cfg, key
    if experiment in ARCH_SIZES:
        arch, size = experiment.rsplit("_", 1)
        assert (cfg.model.arch, cfg.model.preset, cfg.run_name) == (arch, size, experiment)
        assert cfg.trainer.precision == "bf16-mixed"


def test_struct_mode_rejects_unknown_keys():
    with pytest.raises(Exception, match="max_tokenz"):
        _compose(["experiment=smoke", "train.max_tokenz=1"])


@pytest.mark.parametrize("name", _files("model"))
def test_model_files_instantiate(name):
    cfg = _compose([f"model={name}"])
    with torch.device("meta"):  # shapes only: fast even for the 180m presets
        model = hydra.utils.instantiate(cfg.model, vocab_size=50257)
    assert model.config.arch == cfg.model.arch
    assert sum(p.numel() for p in model.parameters()) > 0


# Data files that need something a test machine lacks: the reason is shown when they are skipped.
DATA_NEEDS = {
    "fineweb_edu": "the Hugging Face hub (network) for FineWeb-Edu and the GPT-2 tokenizer",
    "shards": "pre-tokenised shards from klalm-prepare-data ($KLALM_SHARDS)",
}


@pytest.mark.parametrize("name", _files("data"))
def test_data_files_instantiate(name, shared_data):
    if name in DATA_NEEDS:
        pytest.skip(f"data={name} needs {DATA_NEEDS[name]}")
    overrides = {
        "enwiki_local": [f"data.data_root={shared_data}"],
        "files": [
            f"data.train={shared_data / 'tinyshakespeare' / 'input.txt'}",
            f"data.tokenizer={shared_data / 'gpt2_tokenizer'}",
        ],  # fmt: skip
    }
    cfg = _compose([f"data={name}", *overrides.get(name, [])])
    datamodule = hydra.utils.instantiate(cfg.data)
    assert len(datamodule.tokenizer) > 0


@pytest.mark.parametrize("name", _files("trainer"), ids=lambda name: f"trainer-{name}")  # "gpu" alone marks gpu
def test_trainer_files_instantiate(name):
    cfg = _compose([f"trainer={name}"])
    params = inspect.signature(pl.Trainer.__init__).parameters
    assert set(cfg.trainer) - {"_target_"} <= set(params), "unknown Trainer arguments"
    if "strategy" in cfg.trainer and not isinstance(cfg.trainer.strategy, str):
        strategy = hydra.utils.instantiate(cfg.trainer.strategy)
        assert isinstance(strategy, pl.strategies.Strategy)
    if cfg.trainer.devices == 1:  # single-device files build a whole Trainer (on the CPU here)
        trainer = hydra.utils.instantiate(cfg.trainer, accelerator="cpu", precision="32-true", logger=False)
        assert trainer.world_size == 1


@pytest.mark.parametrize("name", _files("optim"))
def test_optim_files_instantiate(name):
    factory = hydra.utils.instantiate(_compose([f"optim={name}"]).optim)
    assert isinstance(factory([torch.nn.Parameter(torch.zeros(2))]), torch.optim.Optimizer)


@pytest.mark.parametrize("name", _files("scheduler"))
def test_scheduler_files_instantiate(name):
    factory = hydra.utils.instantiate(_compose([f"scheduler={name}"]).scheduler)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    scheduler = factory(opt, 100)
    assert 0 < opt.param_groups[0]["lr"] <= 1.0 and scheduler.last_epoch == 0


@pytest.mark.parametrize("name", _files("logger"))
def test_logger_files_instantiate(name, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    cfg = _compose([f"logger={name}", f"paths.run_dir={tmp_path}"])
    loggers = [hydra.utils.instantiate(entry) for entry in cfg.logger.values()]
    assert loggers and all(isinstance(lg, pl.loggers.Logger) for lg in loggers)


@pytest.mark.parametrize("name", _files("callbacks"))
def test_callback_files_instantiate(name, tmp_path):
    cfg = _compose([f"callbacks={name}", f"paths.run_dir={tmp_path}"])
    callbacks = [hydra.utils.instantiate(entry) for entry in cfg.callbacks.values() if entry is not None]
    assert callbacks and all(isinstance(cb, pl.Callback) for cb in callbacks)


@pytest.mark.parametrize("override", [f"{g}={n}" for g in ("debug", "sweep", "paths", "hydra") for n in _files(g)])
def test_overlay_files_compose(override):
    cfg = _compose(["experiment=smoke", override])
    assert cfg.run_name == "smoke"


def _targets(node, key: str):
    """(key, target) of each `_target_` in a config file's tree, read as written (no interpolation resolved)."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield key, node["_target_"]
        for name, value in node.items():
            yield from _targets(value, f"{key}.{name}" if key else str(name))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _targets(value, f"{key}[{i}]")


CONFIG_TARGETS = sorted(
    (f"{path.relative_to(CONFIGS)}:{key or '.'}", target)
    for path in CONFIGS.rglob("*.yaml")
    for key, target in _targets(OmegaConf.to_container(OmegaConf.load(path), resolve=False), "")
)


@pytest.mark.parametrize(("where", "target"), CONFIG_TARGETS, ids=[where for where, _ in CONFIG_TARGETS])
def test_every_config_target_resolves_and_passes_hydras_target_policy(where, target):
    assert callable(resolve_target(where, OmegaConf.create({"_target_": target})))
