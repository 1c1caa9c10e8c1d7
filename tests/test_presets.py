"""Every preset: exact parameter count, ±5 % budget, same width and depth per size; klalm-params; model YAMLs."""

from __future__ import annotations

import inspect
from pathlib import Path

import hydra
import pytest
import torch
import yaml
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

from klalm.cli import params
from klalm.cli.helptext import key_comments
from klalm.models import ARCH_LAYOUTS, MIXERS, KLALMForCausalLM
from klalm.models.config import SHARED_MIXER_FIELDS
from klalm.models.params import preset_parameter_count
from klalm.models.presets import BUDGET_TOLERANCE, PRESETS

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "model"

# Pinned exact counts (GPT-2 vocab 50257 -> 50304, tied head); docs/models.md shows the same table.
EXPECTED = {
    "gpt_45m": 45_029_888,
    "kla_45m": 44_771_846,
    "mamba_45m": 44_777_984,
    "gdn_45m": 44_711_240,
    "gpt_kla_45m": 45_773_313,
    "gpt_180m": 179_983_360,
    "kla_180m": 180_433_930,
    "mamba_180m": 179_143_680,
    "gdn_180m": 179_576_440,
    "gpt_kla_180m": 182_780_929,
    "gpt_tiny": 3_301_696,
    "kla_tiny": 3_344_194,
    "mamba_tiny": 3_334_208,
    "gdn_tiny": 3_321_208,
    "gpt_kla_tiny": 3_322_945,
}


def test_table_covers_every_arch_and_size():
    assert set(PRESETS) == {f"{arch}_{size}" for arch in ARCH_LAYOUTS for size in ("45m", "180m", "tiny")}
    assert set(EXPECTED) == set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_exact_count_and_budget(name):
    count = preset_parameter_count(name)
    assert count == EXPECTED[name]
    budget = PRESETS[name].budget
    if budget is not None:
        assert abs(count / budget - 1) <= BUDGET_TOLERANCE, f"{name}: {count:,} is off its budget {budget:,}"


@pytest.mark.parametrize("size", ["45m", "180m", "tiny"])
def test_same_width_and_depth_across_archs(size):
    rows = [row for name, row in PRESETS.items() if name == f"{row.arch}_{size}"]
    assert len(rows) == len(ARCH_LAYOUTS)
    assert len({(row.d_model, row.n_layers) for row in rows}) == 1


def test_klalm_params_prints_every_preset(capsys):
    params([])
    header, *lines = capsys.readouterr().out.strip().splitlines()
    assert header.startswith("# preset parameters (vocabulary 50,257 padded to 50,304")
    assert lines == [f"{name} {EXPECTED[name]:,}" for name in PRESETS]


def test_klalm_params_counts_for_another_vocabulary(capsys):
    params(["--vocab-size", "4096", "--preset", "kla_tiny", "gpt_45m"])
    header, *lines = capsys.readouterr().out.strip().splitlines()
    assert "vocabulary 4,096 padded to 4,096" in header
    embedding_change = (50304 - 4096) * PRESETS["gpt_45m"].d_model  # tied: counted once
    assert lines == [
        f"kla_tiny {EXPECTED['kla_tiny'] - (50304 - 4096) * PRESETS['kla_tiny'].d_model:,}",
        f"gpt_45m {EXPECTED['gpt_45m'] - embedding_change:,}",
    ]


def test_klalm_params_prints_a_repeated_preset_once(capsys):
    params(["--preset", "gpt_45m", "kla_tiny", "gpt_45m", "kla_tiny"])
    _, *lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [f"gpt_45m {EXPECTED['gpt_45m']:,}", f"kla_tiny {EXPECTED['kla_tiny']:,}"]


@pytest.mark.parametrize(("argv", "message"), [(["--preset", "kla_9b"], "kla_9b"), (["--vocab-size", "0"], "vocab")])
def test_klalm_params_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        params(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def _model_config(name: str, overrides: tuple[str, ...] = ()) -> DictConfig:
    """configs/model/<name>.yaml as Hydra composes it (struct mode: only keys the files spell out can be set)."""
    with initialize_config_module("klalm.configs", version_base="1.3"):
        return compose(overrides=[f"+model={name}", *(f"model.{o}" for o in overrides)]).model


def test_one_model_file_per_architecture_and_one_line_per_size():
    """The keys of an arch live in configs/model/_<arch>.yaml; a <arch>_<size> file only picks the preset."""
    for name in PRESETS:
        arch, size = PRESETS[name].arch, name[len(PRESETS[name].arch) + 1 :]
        cfg = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
        assert cfg == {"defaults": [f"_{arch}", "_self_"], "preset": size}
    assert sorted(p.stem for p in CONFIGS.glob("_*.yaml")) == sorted(f"_{arch}" for arch in ARCH_LAYOUTS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_model_yaml_instantiates_its_preset(name):
    cfg = _model_config(name)
    assert (cfg.arch, f"{cfg.arch}_{cfg.preset}") == (PRESETS[name].arch, name)
    with torch.device("meta"):
        model = hydra.utils.instantiate(cfg, vocab_size=50257)
    assert isinstance(model, KLALMForCausalLM)
    assert sum(p.numel() for p in model.parameters()) == EXPECTED[name]


def test_model_yaml_overrides_reach_the_model():
    overrides = ("d_model=32", "kla_layers=[0]", "mixer_options.kla.block=plain", "mixer_options.kla.d_state=8",
                 "mixer_options.attention.backend=math")  # fmt: skip
    cfg = _model_config("gpt_kla_tiny", overrides)
    model = hydra.utils.instantiate(cfg, vocab_size=100)
    assert model.config.d_model == 32 and model.config.layer_mixers == ["kla", "attention"]
    assert model.config.mixer_options == {"attention": {"backend": "math"}, "kla": {"block": "plain", "d_state": 8}}
    kla, attention = (layer.mixer for layer in model.model.layers)
    assert (kla.block, kla.d_state, attention.backend) == ("plain", 8, "math")
    model.config.to_json_string()  # options arrive as plain containers, so the config serialises


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_model_yaml_spells_out_every_mixer_option(name):
    """Every constructor option of the arch's mixers is a null key, commented with the constructor's default."""
    cfg = _model_config(name)
    comments = {}
    for path in sorted(CONFIGS.glob("_*.yaml")):
        comments.update(key_comments(path.read_text(), ""))
    layout = ARCH_LAYOUTS[cfg.arch]
    assert list(cfg.mixer_options) == [m for m in (layout.base, layout.at_kla_layers) if m]
    for mixer, options in cfg.mixer_options.items():
        signature = inspect.signature(MIXERS[mixer].__init__).parameters
        shared = SHARED_MIXER_FIELDS.get(mixer, ())
        expected = [k for k, p in signature.items() if p.kind == p.KEYWORD_ONLY and k not in shared]
        assert list(options) == expected and all(v is None for v in options.values())
        for key in expected:
            default = yaml.safe_load(comments[f"mixer_options.{mixer}.{key}"].rsplit(" [", 1)[1][:-1])
            want = signature[key].default
            assert default == (list(want) if isinstance(want, tuple) else want), (mixer, key)


def test_every_model_yaml_is_a_preset():
    assert {path.stem for path in CONFIGS.glob("*.yaml") if not path.stem.startswith("_")} == set(PRESETS)
