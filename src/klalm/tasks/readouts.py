"""How a synthetic task reads its answer out of a causal LM: the logits at every position (`TokenReadout`), or MAD's
decoder that rebuilds the whole sequence from the last position's hidden state (`LastPositionDecoder`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from klalm.tasks.base import SyntheticTask


class LastPositionDecoder(nn.Module):
    """MAD's compression readout: rebuild L tokens from the LM's final hidden state at the last position.

    The LM's final (normed) hidden states are captured from the input of its output embedding, so any model with
    `get_output_embeddings()` works. Decoder (MAD's AutoEncoder): h_last + sinusoidal position embedding of each
    output slot -> [LayerNorm, Linear, GELU] x 2 -> LayerNorm -> Linear(D, V).

    Args:
        model: a causal LM (forward(input_ids).logits, get_output_embeddings()).
        d_model: D, the LM's hidden width.
        seq_len: L, output slots.
        vocab_size: V, output classes.
    """

    def __init__(self, model: nn.Module, d_model: int, seq_len: int, vocab_size: int):
        super().__init__()
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no output embedding to read hidden states from")
        self.model = model
        self._hidden: Tensor | None = None
        head.register_forward_pre_hook(self._capture)
        self.register_buffer("positions", _sincos(seq_len, d_model), persistent=False)  # [L, D]
        layers = [m for _ in range(2) for m in (nn.LayerNorm(d_model), nn.Linear(d_model, d_model), nn.GELU())]
        self.decoder = nn.Sequential(*layers, nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size))

    def _capture(self, module: nn.Module, args: tuple[Tensor, ...]) -> None:
        self._hidden = args[0]

    def forward(self, input_ids: Tensor) -> Tensor:
        """input_ids [B, L] -> logits [B, L, V] for the L reconstructed tokens."""
        self.model(input_ids, use_cache=False)
        last = self._hidden[:, -1]  # [B, D]
        self._hidden = None
        return self.decoder(last[:, None, :] + self.positions.to(last.dtype))  # [B, L, V]


def _sincos(length: int, dim: int) -> Tensor:
    """Sinusoidal position embeddings [length, dim] (sin in even, cos in odd columns)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # [L, 1]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10_000.0) / dim))  # [D/2]
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table


class TokenReadout(nn.Module):
    """The usual readout: the LM's logits at every position, or at given positions only.

    Args:
        model: a klalm causal LM (`klalm.models.build_model`): its `model` maps input_ids to final-normed hidden
            states and `get_output_embeddings()` is its head.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, positions: Tensor | None = None) -> Tensor:
        """input_ids [B, L] -> logits [B, L, V]; with positions [B, K] (int64) the logits there only, [B, K, V].

        The head is most of a step's work when the vocabulary is large and few positions are scored (MQAR: 8,192
        classes, K of L positions), so training asks for the scored positions only.
        """
        if positions is None:
            return self.model(input_ids, use_cache=False).logits
        hidden, _ = self.model.model(input_ids)  # [B, L, D]
        picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, K, D]
        return self.model.get_output_embeddings()(picked)  # [B, K, V]


def wrap_readout(model: nn.Module, task: SyntheticTask, d_model: int) -> nn.Module:
    """The module to train for `task`: the LM itself, or the LM plus MAD's last-position decoder."""
    readouts: dict[str, Callable[[], nn.Module]] = {
        "token": lambda: TokenReadout(model),
        "last_position": lambda: LastPositionDecoder(model, d_model, task.seq_len, task.vocab_size),
    }
    return readouts[task.readout]()
