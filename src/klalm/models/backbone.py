"""The one backbone every klalm architecture shares; only the mixer of each layer differs.

    h_0     = E[input_ids]                                   token embedding, [B, L, D]
    u_i     = h_{i-1} + mixer_i(RMSNorm(h_{i-1}))            i = 1..N (pre-norm residual blocks)
    h_i     = u_i + W_down(SiLU(W_gate·n) ⊙ W_up·n),  n = RMSNorm(u_i)      (SwiGLU MLP)
    logits  = RMSNorm(h_N)·Eᵀ                                LM head tied to the embedding by default

Weights follow GPT-2: normal(0, σ) with σ = initializer_range, and the projections that write into the
residual stream (the mixer's `out_proj` and the MLP's `w_down`) normal(0, σ/√(2N)), so the residual
stream's variance does not grow with depth. `INIT_RULES` is the whole table; parameters it does not match
keep the initialisation of the module that owns them (the recurrent mixers' dynamics need theirs).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from klalm.models.config import KLALMConfig
from klalm.models.mixers import lookup


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019) with a learned gain: x / rms(x) · w, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class SwiGLU(nn.Module):
    """Gated MLP (Shazeer 2020): W_down(SiLU(W_gate·x) ⊙ W_up·x); D -> F -> D, no biases, 3·D·F parameters."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    """One pre-norm residual block: h + mixer(norm(h)), then + SwiGLU(norm(.)); split in two for MC readouts."""

    def __init__(self, config: KLALMConfig, layer_idx: int, mixer_name: str):
        super().__init__()
        self.mixer_name = mixer_name
        self.mixer_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mixer = lookup(mixer_name)(config.d_model, layer_idx=layer_idx, **config.mixer_kwargs(mixer_name))
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config.d_model, config.d_ff)

    def mix(self, h: Tensor, state: Any = None, return_variance: bool = False) -> tuple[Tensor, Any, Tensor | None]:
        """The mixer half: h [B, L, D] -> (h + mixer(norm(h)) [B, L, D], new state, mixer output variance or None)."""
        if return_variance:
            y, state, y_var = self.mixer(self.mixer_norm(h), state, return_variance=True)
            return h + y, state, y_var
        y, state = self.mixer(self.mixer_norm(h), state)
        return h + y, state, None

    def feed(self, h: Tensor) -> Tensor:
        """The MLP half: h + SwiGLU(norm(h)), [B, L, D]."""
        return h + self.mlp(self.mlp_norm(h))

    def forward(self, h: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        h, state, _ = self.mix(h, state)
        return self.feed(h), state


InitRule = Callable[[Tensor, KLALMConfig], None]


def _normal(p: Tensor, cfg: KLALMConfig) -> None:
    nn.init.normal_(p, mean=0.0, std=cfg.initializer_range)


def _residual(p: Tensor, cfg: KLALMConfig) -> None:
    nn.init.normal_(p, mean=0.0, std=cfg.initializer_range / math.sqrt(2 * cfg.n_layers))


def _ones(p: Tensor, cfg: KLALMConfig) -> None:
    nn.init.ones_(p)


# The init table: (regex on the parameter's name inside KLALM, rule). First match wins; unmatched parameters
# keep their module's own init. nn.init.* is looked up at call time so Hugging Face's loading guard applies.
INIT_RULES: tuple[tuple[str, InitRule], ...] = (
    (r"^embed\.weight$", _normal),
    (r"^lm_head\.weight$", _normal),  # only reached when untied; a tied head is the embedding
    (r"norm\.weight$", _ones),
    (r"\.mlp\.w_(gate|up)\.weight$", _normal),
    (r"\.mlp\.w_down\.weight$", _residual),
    (r"\.mixer\.out_proj\.weight$", _residual),
    (r"\.mixer\.qkv_proj\.weight$", _normal),
)


class KLALM(nn.Module):
    """The language model without Hugging Face wrapping: ids [B, L] -> hidden states or logits [B, L, V].

    Args:
        config: a KLALMConfig; config.layer_mixers names each layer's mixer.
    """

    def __init__(self, config: KLALMConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config, i, name) for i, name in enumerate(config.layer_mixers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Apply INIT_RULES to every parameter they match (a tied head is initialised once, as the embedding)."""
        seen: set[int] = set()
        for name, param in self.named_parameters(remove_duplicate=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            rule = next((rule for pattern, rule in INIT_RULES if re.search(pattern, name)), None)
            if rule is not None:
                rule(param, self.config)

    def forward(self, input_ids: Tensor, states: list[Any] | None = None) -> tuple[Tensor, list[Any]]:
        """Run the stack: input_ids [B, L] -> (final-normed hidden states [B, L, D], per-layer states after L)."""
        h = self.embed(input_ids)  # [B, L, D]
        states = states if states is not None else [None] * len(self.layers)
        new_states = []
        for block, state in zip(self.layers, states, strict=True):
            h, state = block(h, state)
            new_states.append(state)
        return self.norm(h), new_states

    @property
    def variance_layer(self) -> int:
        """Index of the last KLA layer, the one whose output variance the uncertainty readouts use."""
        kla = [i for i, block in enumerate(self.layers) if block.mixer_name == "kla"]
        if not kla:
            mixers = [block.mixer_name for block in self.layers]
            raise ValueError(f"uncertainty readouts need a KLA layer; this model's layers are {mixers}")
        return kla[-1]

    def _rest(self, u: Tensor, k: int) -> Tensor:
        """Finish the stack from the residual stream u [B, L, D] right after layer k's mixer: final-normed hidden."""
        h = self.layers[k].feed(u)
        for block in self.layers[k + 1 :]:
            h, _ = block(h)
        return self.norm(h)

    def forward_uncertain(self, input_ids: Tensor, mc_samples: int = 0) -> tuple[Tensor, Tensor, Tensor | None]:
        """Full forward that also reads out the last KLA layer's output variance, and optionally an MC marginal.

        What is sampled: the output of the last KLA mixer, y ~ N(ŷ, diag(y_var)), independently per batch
        element, position and channel (y_var is the filter's predictive variance gated by SiLU(g)² and pushed
        through out_proj's squared weights, i.e. channels treated as independent). Each sample is added to the
        residual stream and pushed through everything after that mixer (its MLP, later layers, final norm,
        LM head) without linearisation; the readout is the average of the n softmaxes. Layers before the KLA
        layer are deterministic and run once.

        Args:
            input_ids: token ids, [B, L] (a fresh sequence; no decode state).
            mc_samples: number n of Monte-Carlo samples (0: no MC readout).

        Returns:
            (final-normed hidden states [B, L, D] at the mean, y_var [B, L, D] >= 0,
            mc_probs [B, L, V] in float32 or wider (rows sum to 1) or None when mc_samples == 0).
        """
        if mc_samples < 0:
            raise ValueError(f"mc_samples must be >= 0, got {mc_samples}")
        k = self.variance_layer
        h = self.embed(input_ids)  # [B, L, D]
        for block in self.layers[:k]:
            h, _ = block(h)
        u, _, y_var = self.layers[k].mix(h, None, return_variance=True)
        hidden = self._rest(u, k)
        if mc_samples == 0:
            return hidden, y_var, None
        std = y_var.clamp_min(0).sqrt().to(u.dtype)
        dtype = torch.promote_types(u.dtype, torch.float32)
        probs = torch.zeros(*input_ids.shape, self.config.vocab_size, device=u.device, dtype=dtype)
        for _ in range(mc_samples):
            sample = self._rest(u + std * torch.randn_like(u), k)
            probs += torch.softmax(self.lm_head(sample).to(dtype), dim=-1)
        return hidden, y_var, probs / mc_samples
