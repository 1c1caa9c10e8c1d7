"""Training FLOPs per token and model FLOPs utilisation (MFU).

Forward FLOPs per token, counted as the work each piece really does (multiply-add = 2 FLOPs):

    dense:      2 · (weights of every Linear and Conv1d)          projections, MLP, LM head, short convs
    attention:  2 · D · (T + 1)          causal QKᵀ and AV: 2·2·D FLOPs per key, (T + 1)/2 keys on average
    kla scan:   29 · M · S               Kalman step (~25 fp32 ops + 2 reciprocals) + readout (2)
    mamba scan:  9 · M · S               exp(ΔA), ΔB·x, h = Ā·h + B̄x, y = C·h
    gdn scan:    7 · H · d_k · d_v       decay, S·k, rank-1 delta update, q·S (per head)

Training FLOPs = 3 × forward (the backward pass costs twice the forward, for matmuls and scans alike).
MFU = training FLOPs/token × tokens/s ÷ (peak dense bf16 FLOP/s per device × devices).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

log = logging.getLogger(__name__)

KLA_SCAN_FLOPS = 29  # per (m, s) element and token, forward
MAMBA_SCAN_FLOPS = 9  # per (m, s) element and token, forward
GDN_SCAN_FLOPS = 7  # per state entry (head, d_k, d_v) and token, forward
BACKWARD_FACTOR = 2  # backward FLOPs / forward FLOPs

# Peak dense bf16 tensor-core throughput per device, FLOP/s (vendor datasheets, without sparsity).
# Looked up by substring of torch.cuda.get_device_name(); the longest matching key wins ("H100 PCIe" before "H100").
PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,
    "H100 PCIe": 756e12,
    "H800": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "B200": 2250e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 70e12,
}


def _attention(mixer: nn.Module, seq_len: int) -> float:
    return 2.0 * mixer.d_model * (seq_len + 1)


def _kla(mixer: nn.Module, seq_len: int) -> float:
    return float(KLA_SCAN_FLOPS * mixer.d_inner * mixer.d_state)


def _mamba(mixer: nn.Module, seq_len: int) -> float:
    return float(MAMBA_SCAN_FLOPS * mixer.d_inner * mixer.d_state)


def _gdn(mixer: nn.Module, seq_len: int) -> float:
    return float(GDN_SCAN_FLOPS * mixer.n_heads * mixer.head_k_dim * mixer.head_v_dim)


# Sequence-mixing FLOPs per token (forward) beyond the mixer's dense layers, by the mixer's registry name.
MIXER_FLOPS: dict[str, Callable[[nn.Module, int], float]] = {
    "attention": _attention,
    "kla": _kla,
    "mamba": _mamba,
    "gdn": _gdn,
}

_DENSE = (nn.Linear, nn.Conv1d)


def _is_dense(module: nn.Module) -> bool:
    """Linear and Conv1d layers, and other conv-like layers with a [C_out, C_in/groups, K] weight."""
    weight = getattr(module, "weight", None)
    is_conv_like = isinstance(weight, nn.Parameter) and weight.ndim == 3 and type(module).__name__.endswith("Conv1d")
    return isinstance(module, _DENSE) or is_conv_like


def forward_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Forward FLOPs per token of a klalm model at sequence length T = `seq_len` (see the module docstring).

    Args:
        model: a klalm model; its blocks carry `mixer_name` and `mixer` (klalm.models.backbone.Block).
        seq_len: training sequence length T (tokens), which sets the attention term.

    Raises:
        KeyError: a block's mixer name has no FLOP formula in MIXER_FLOPS (the valid names are listed).
    """
    dense = sum(2.0 * m.weight.numel() for m in model.modules() if _is_dense(m))
    mixing = 0.0
    for module in model.modules():
        name = getattr(module, "mixer_name", None)
        if name is None:
            continue
        if name not in MIXER_FLOPS:
            raise KeyError(f"no FLOP formula for mixer {name!r}; valid: {sorted(MIXER_FLOPS)}")
        mixing += MIXER_FLOPS[name](module.mixer, seq_len)
    return dense + mixing


def train_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training (forward + backward) FLOPs per token: (1 + BACKWARD_FACTOR) × forward."""
    return (1 + BACKWARD_FACTOR) * forward_flops_per_token(model, seq_len)


def peak_flops(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s of a GPU from its name, or None when the name is not in PEAK_BF16_FLOPS."""
    matches = [key for key in PEAK_BF16_FLOPS if key in device_name]
    return PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None
