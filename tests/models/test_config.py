"""KLALMConfig and build_model: derived fields, and bad input that names the offending keys."""

from __future__ import annotations

import pytest

from klalm.models import build_model
from klalm.models.config import KLALMConfig, pad_vocab


@pytest.mark.parametrize("raw, padded", [(50257, 50304), (50304, 50304), (1, 64), (64, 64), (65, 128)])
def test_vocab_is_padded_to_a_multiple_of_64(raw, padded):
    assert pad_vocab(raw) == padded
    assert KLALMConfig(vocab_size=raw).vocab_size == padded


def test_default_d_ff_is_8_thirds_d_rounded_to_64():
    assert KLALMConfig(d_model=512).d_ff == 1408  # 8/3·512 = 1365.3 -> 1408
    assert KLALMConfig(d_model=512, d_ff=100).d_ff == 100


def test_hf_generic_names():
    config = KLALMConfig(d_model=128, n_layers=3, n_heads=4)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (128, 3, 4)


def test_mixer_kwargs_merge_shared_fields_and_options():
    config = KLALMConfig(arch="gpt_kla", n_heads=4, rope_theta=500.0, mixer_options={"kla": {"d_state": 8}})
    assert config.mixer_kwargs("attention") == {"n_heads": 4, "rope_theta": 500.0}
    assert config.mixer_kwargs("kla") == {"d_state": 8}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"arch": "transformer"}, r"unknown arch 'transformer'; valid: \['gdn', 'gpt', 'gpt_kla', 'kla', 'mamba'\]"),
        ({"d_model": 100, "n_heads": 8}, "d_model=100 is not divisible by n_heads=8"),
        ({"n_layers": 0}, "n_layers must be >= 1"),
        ({"arch": "kla", "kla_layers": [0]}, "kla_layers=.* only applies to arch 'gpt_kla'"),
        ({"arch": "gpt_kla", "n_layers": 2, "kla_layers": [2]}, r"kla_layers=\[2\] must be .* n_layers=2"),
        ({"arch": "gpt_kla", "kla_layers": []}, "kla_layers=.* non-empty"),
        ({"mixer_options": {"kla": {"d_stat": 8}}}, r"mixer_options\['kla'\] has unknown keys \['d_stat'\]"),
        ({"mixer_options": {"attention": {"n_heads": 2}}}, r"mixer_options\['attention'\] sets \['n_heads'\]"),
    ],
)
def test_bad_config_names_the_keys(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KLALMConfig(**kwargs)


def test_unknown_mixer_in_options_lists_valid_names():
    with pytest.raises(KeyError, match="unknown mixer 'lstm'; valid"):
        KLALMConfig(mixer_options={"lstm": {}})


def test_attention_heads_only_checked_when_attention_is_used():
    assert KLALMConfig(arch="mamba", d_model=100, n_heads=8).d_model == 100


def test_build_model_errors():
    with pytest.raises(ValueError, match=r"unknown arch 'bert'; valid: \['gdn', 'gpt', 'gpt_kla', 'kla', 'mamba'\]"):
        build_model("bert")
    with pytest.raises(KeyError, match=r"unknown preset 'gpt_7b'.*sizes for 'gpt': \['180m', '45m', 'tiny'\]"):
        build_model("gpt", preset="7b")
    with pytest.raises(ValueError, match=r"unknown keys \['hidden'\]; valid: .*'d_model'"):
        build_model("gpt", preset="tiny", hidden=12)


def test_build_model_overrides_and_nulls():
    model = build_model(
        "kla", preset="tiny", vocab_size=100, d_model=32, n_layers=None, mixer_options={"kla": {"d_state": 4}}
    )
    config = model.config
    assert (config.vocab_size, config.d_model, config.n_layers, config.d_ff) == (128, 32, 2, 128)
    assert model.model.layers[0].mixer.d_state == 4


@pytest.mark.parametrize(
    ("mixer", "old", "new"),
    [("kla", "conv_kernel", "d_conv"), ("kla", "scan_backend", "backend"), ("gdn", "num_heads", "n_heads")],
)
def test_renamed_mixer_options_are_refused_with_the_new_name(mixer, old, new):
    with pytest.raises(ValueError, match=f"{old}.*was renamed: use '{new}'"):
        build_model(mixer, preset="tiny", vocab_size=64, mixer_options={mixer: {old: 4}})


def test_a_mixer_refuses_a_renamed_option_itself():
    from klalm.models.mixers.mamba import MambaMixer

    with pytest.raises(ValueError, match="MambaMixer option 'scan_backend' was renamed: use 'backend'"):
        MambaMixer(32, scan_backend="torch")
