"""The model zoo on a CUDA device (skipped without one): fast paths against the CPU-tested behaviour."""

from __future__ import annotations

import pytest
import torch

from klalm.models import ARCH_LAYOUTS, build_model
from klalm.models.mixers.attention import attend_math, attend_sdpa

pytestmark = pytest.mark.gpu
ARCHS = sorted(ARCH_LAYOUTS)
V = 256


def _tiny(arch: str):
    torch.manual_seed(0)
    return build_model(arch, preset="tiny", vocab_size=V).cuda().eval()


def _ids(batch: int = 2, length: int = 40) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(4)).cuda()


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_sdpa_matches_math_on_gpu(dtype, tol):
    q, k, v = (torch.randn(2, 4, 64, 64, device="cuda", dtype=dtype) for _ in range(3))
    torch.testing.assert_close(attend_sdpa(q, k, v), attend_math(q, k, v), rtol=tol, atol=tol)
    torch.testing.assert_close(attend_sdpa(q[:, :, -1:], k, v), attend_math(q[:, :, -1:], k, v), rtol=tol, atol=tol)


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_autocast_forward_backward(arch):
    model, ids = _tiny(arch).train(), _ids()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("arch", ARCHS)
def test_decode_matches_full_forward_on_gpu(arch):
    model, ids = _tiny(arch), _ids()
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :17], use_cache=True)
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        steps = [out.logits]
        for t in range(17, ids.shape[1]):
            steps.append(model(ids[:, t : t + 1], cache=cache).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_on_gpu(arch):
    model, prompt = _tiny(arch), _ids(batch=1, length=8)
    generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        logits = model(generated).logits[:, 7:-1]  # [1, 8, V]: the predictions of the generated tokens
    # each generated token is an argmax of the full forward, up to the decode path's float32 rounding
    chosen = logits.gather(-1, generated[:, 8:, None])[..., 0]
    assert (logits.max(-1).values - chosen).max() < 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_model_matches_eager(arch):
    """torch.compile (inductor, one graph: fullgraph) of each LM with its default backends, chosen by the eager run
    first (the scans and the RoPE table custom ops): loss and gradients as eager under bf16 autocast."""
    ids = _ids()
    runs = []
    for compiled in (False, True):
        model = _tiny(arch).train()
        step = torch.compile(model, fullgraph=True) if compiled else model
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step(ids, labels=ids).loss
        loss.backward()
        runs.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (loss, grads), (loss_c, grads_c) = runs
    torch.testing.assert_close(loss_c, loss, rtol=2e-2, atol=2e-2)
    for name, grad in grads.items():
        err = ((grads_c[name].float() - grad.float()).norm() / grad.float().norm().clamp_min(1e-12)).item()
        assert err <= 5e-2, f"{name}: relative error {err:.2e}"
