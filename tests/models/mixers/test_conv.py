"""CausalConv1d: output, window and all four gradients equal F.conv1d on the transposed padded input, and a sequence
split into two calls that pass the window equals one call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from klalm.models.mixers.conv import CausalConv1d

B, L, M = 2, 13, 6
TOLERANCES = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


def _oracle(conv: CausalConv1d, x, window):
    """The depthwise conv1d in the [B, M, L] layout, with weight and bias cast to x's dtype."""
    padded = torch.cat([window, x.transpose(1, 2)], -1)  # [B, M, L + K − 1]
    bias = None if conv.bias is None else conv.bias.to(x.dtype)
    y = F.conv1d(padded, conv.weight.to(x.dtype), bias, groups=M)  # [B, M, L]
    return y.transpose(1, 2), padded[:, :, padded.shape[-1] - (conv.kernel_size - 1) :]


def _outputs_and_grads(fn, conv, x, window):
    """(y, window, dx, dwindow, dweight, dbias) for a fixed random cotangent of y."""
    x, window = x.detach().requires_grad_(), window.detach().requires_grad_()
    y, new_window = fn(conv, x, window)
    params = [conv.weight] + ([] if conv.bias is None else [conv.bias])
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(y.dtype)
    grads = torch.autograd.grad(y, [x, window, *params], dy)
    return y, new_window, *grads


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("kernel_size", [1, 2, 4])
def test_matches_conv1d(kernel_size, bias, dtype):
    torch.manual_seed(0)
    conv = CausalConv1d(M, kernel_size, bias=bias)  # float32 parameters, as under autocast
    if dtype == torch.float64:
        conv = conv.double()
    x = torch.randn(B, L, M, dtype=dtype)
    window = torch.randn(B, M, kernel_size - 1, dtype=dtype)
    got = _outputs_and_grads(CausalConv1d.forward, conv, x, window)
    want = _outputs_and_grads(_oracle, conv, x, window)
    assert got[0].dtype == got[1].dtype == dtype and got[1].shape == (B, M, kernel_size - 1)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.to(g.dtype), **TOLERANCES[dtype])


@pytest.mark.parametrize("split", [1, 5])
@pytest.mark.parametrize("kernel_size", [1, 2, 4])
def test_chunked_call_equals_one_call(kernel_size, split):
    torch.manual_seed(0)
    conv = CausalConv1d(M, kernel_size).double()
    x = torch.randn(B, L, M, dtype=torch.float64)
    y, window = conv(x)
    y1, w1 = conv(x[:, :split])
    y2, w2 = conv(x[:, split:], w1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=0, atol=0)
    torch.testing.assert_close(w2, window, rtol=0, atol=0)
