"""The short causal convolution every recurrent mixer (KLA, Mamba, Gated DeltaNet) runs before its scan."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from klalm.ops.common import compute_dtype


class CausalConv1d(nn.Module):
    """Depthwise causal conv1d over time that carries its last `kernel_size − 1` inputs as a window."""

    def __init__(self, channels: int, kernel_size: int, bias: bool = True):
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"conv kernel size must be >= 1, got {kernel_size}")
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None
        bound = 1.0 / math.sqrt(kernel_size)  # PyTorch's Conv1d default for a depthwise conv
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def init_window(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """An all-zero window, [B, M, kernel_size − 1] (a fresh sequence is left-padded with zeros)."""
        return torch.zeros(batch_size, self.weight.shape[0], self.kernel_size - 1, device=device, dtype=dtype)

    def forward(self, x: Tensor, window: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x [B, L, M], window [B, M, kernel_size − 1] or None -> (y [B, L, M], new window).

        y[:, t] = bias + Σ_j weight[:, 0, j] · padded[:, t + j]: K shifted multiply-adds in the [B, L, M] layout
        (no transposes, so torch.compile fuses them into one elementwise kernel), in float32 (float64 stays
        float64) and cast back to x's dtype once at the end.
        """
        length = x.shape[1]
        if window is None:
            window = self.init_window(x.shape[0], x.device, x.dtype)
        padded = torch.cat([window.transpose(1, 2).to(x.dtype), x], 1)  # [B, L + K − 1, M]
        dtype = compute_dtype(x.dtype)
        xc, w = padded.to(dtype), self.weight[:, 0].to(dtype)  # [B, L + K − 1, M], [M, K]
        y = sum(xc[:, j : j + length] * w[:, j] for j in range(self.kernel_size))
        if self.bias is not None:
            y = y + self.bias.to(dtype)
        return y.to(x.dtype), padded[:, length:].transpose(1, 2)
