"""FLOPs per token: dense weights, the mixer terms, and the peak-rate table."""

import pytest
import torch
from torch import nn

from klalm.models import build_model
from klalm.train.flops import (
    KLA_SCAN_FLOPS,
    MIXER_FLOPS,
    forward_flops_per_token,
    peak_flops,
    train_flops_per_token,
)


def _dense_flops(model: nn.Module) -> float:
    """2 FLOPs per weight of every matmul-like layer, the LM head included once."""
    total = 0.0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Linear) or (isinstance(weight, nn.Parameter) and weight.ndim == 3):
            total += 2.0 * weight.numel()
    return total


@pytest.mark.parametrize("arch", ["gpt", "kla", "mamba", "gdn", "gpt_kla"])
def test_forward_flops_are_dense_plus_mixers(arch):
    torch.manual_seed(0)
    model = build_model(arch, preset="tiny", vocab_size=256)
    seq_len = 128
    mixers = [(block.mixer_name, block.mixer) for block in model.model.layers]
    expected = _dense_flops(model) + sum(MIXER_FLOPS[name](mixer, seq_len) for name, mixer in mixers)
    assert forward_flops_per_token(model, seq_len) == pytest.approx(expected)
    assert train_flops_per_token(model, seq_len) == pytest.approx(3 * expected)
    lm_head = 2 * model.config.d_model * model.config.vocab_size
    assert forward_flops_per_token(model, seq_len) > lm_head


def test_attention_term_grows_with_length_and_scans_do_not():
    torch.manual_seed(0)
    gpt = build_model("gpt", preset="tiny", vocab_size=256)
    kla = build_model("kla", preset="tiny", vocab_size=256)
    d, n = gpt.config.d_model, gpt.config.n_layers
    # causal attention: 2·D·(T+1) per layer and token
    assert forward_flops_per_token(gpt, 2048) - forward_flops_per_token(gpt, 1024) == pytest.approx(2 * d * 1024 * n)
    assert forward_flops_per_token(kla, 2048) == forward_flops_per_token(kla, 1024)
    mixer = kla.model.layers[0].mixer
    assert MIXER_FLOPS["kla"](mixer, 1) == KLA_SCAN_FLOPS * mixer.d_inner * mixer.d_state


def test_unknown_mixer_raises_listing_valid_names():
    block = nn.Module()
    block.mixer_name, block.mixer = "rwkv", nn.Identity()
    model = nn.Sequential(block)
    with pytest.raises(KeyError, match="rwkv.*valid"):
        forward_flops_per_token(model, 16)


def test_peak_table_lookup():
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12  # the longer key wins
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("Some Future GPU") is None
