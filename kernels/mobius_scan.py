"""`kla_scan_triton`: the fused Triton KLA scan, differentiable in every tensor (backend "triton").

Oracle: `klalm.ops.reference.kla_scan_reference` (same arguments, same results up to float32 rounding).
The forward kernel is in mobius_scan_fwd.py and the backward kernel in mobius_scan_bwd.py; this file
checks inputs and ties them together with a `torch.autograd.Function`.

On CPU tensors the kernels run only under Triton's interpreter (`TRITON_INTERPRET=1` set before
`triton` is imported), which is how the tests run them without a GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from klalm.kernels.common import ScanConfig, check_config, check_kernel_device, check_offsets
from klalm.kernels.mobius_scan_bwd import mobius_scan_bwd
from klalm.kernels.mobius_scan_fwd import mobius_scan_fwd
from klalm.ops.checks import check_inputs
from klalm.ops.reference import KLAState

MAX_STATE_SIZE = 64


class _MobiusScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, lambda_v, k, q, a, p, lam0, eta0, decode_from_prior: bool, config: ScanConfig, floor):
        y, y_var, lam, eta, ckpt_P, ckpt_mu = mobius_scan_fwd(
            v, lambda_v, k, q, a, p, lam0, eta0, decode_from_prior, config, any(ctx.needs_input_grad), floor
        )
        ctx.save_for_backward(v, lambda_v, k, q, a, p, lam0, eta0, lam, eta, ckpt_P, ckpt_mu)
        ctx.decode_from_prior, ctx.config, ctx.floor = decode_from_prior, config, floor
        ctx.set_materialize_grads(False)  # unused outputs (y_var in training, the final state) arrive as None
        return y, y_var, lam, eta

    @staticmethod
    @once_differentiable
    def backward(ctx, gy, gyv, glam, geta):
        saved = ctx.saved_tensors
        v = saved[0]
        gy = torch.zeros_like(v) if gy is None else gy.contiguous()
        gyv = None if gyv is None else gyv.contiguous()  # None: y_var unused, the kernel skips its terms
        grads = mobius_scan_bwd(saved, gy, gyv, glam, geta, ctx.decode_from_prior, ctx.config, ctx.floor)
        return (*grads, None, None, None)


def kla_scan_triton(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    initial_state: KLAState | None = None,
    decode_from_prior: bool = False,
    config: ScanConfig | None = None,
    *,
    precision_floor: float | None = None,
) -> tuple[Tensor, Tensor, KLAState]:
    """Run the KLA filter over a sequence with the fused Triton kernels (differentiable in every tensor).

    Args:
        v: values, [B, L, M]; float16/bfloat16/float32, computed in float32 (16-bit rows are read in pairs).
        lambda_v: value precisions Λ, [B, L, M], > 0; or, with `precision_floor`, log σ² (any finite value).
        k: keys (observation map), [B, L, S], S ≤ 64 (padded to a power of two inside).
        q: queries (readout), [B, L, S].
        a: discrete decay, [M, S], in (0, 1].
        p: discrete process noise, [M, S], ≥ 0.
        initial_state: KLAState(lam [B, M, S] > 0, eta [B, M, S]) or None for λ0 = 1, η0 = 0.
        decode_from_prior: read out the one-step-ahead prediction (a·μ, a²·σ² + p) instead of the posterior.
        config: launch parameters (`ScanConfig()` by default; its `segment` picks the time-parallel split).
        precision_floor: when given, lambda_v holds log σ² and the kernels form Λ = 1/(softplus(log σ²) +
            precision_floor) as they load it (no float32 [B, L, M] Λ in memory); its gradient is then d/d log σ².
    Returns:
        y, y_var [B, L, M] in v's dtype and the final KLAState (float32 [B, M, S] each), as the reference.
    Shapes and dtypes are always checked; values (Λ > 0 etc.) on CPU tensors or when $KLALM_CHECK_INPUTS=1
    (`klalm.ops.checks`), since on a GPU they cost a device synchronisation.
    """
    lambda_name = "lambda_v" if precision_floor is None else "logvar"
    check_inputs(v, lambda_v, k, q, a, p, initial_state, lambda_name=lambda_name)
    tensors = {"v": v, lambda_name: lambda_v, "k": k, "q": q, "a": a, "p": p}
    if initial_state is not None:
        tensors |= {"initial_state.lam": initial_state.lam, "initial_state.eta": initial_state.eta}
    check_kernel_device(tensors)
    if not 1 <= k.shape[-1] <= MAX_STATE_SIZE:
        raise ValueError(f"state size S={k.shape[-1]} must be in [1, {MAX_STATE_SIZE}] for the Triton kernels")
    check_offsets(v.shape[1], v.shape[2], k.shape[-1])
    lam0, eta0 = (None, None) if initial_state is None else (initial_state.lam, initial_state.eta)
    if v.shape[1] == 0:
        return _empty_scan(v, k.shape[-1], lam0, eta0)
    config = config or ScanConfig()
    check_config(config)
    args = [x.contiguous() if x is not None else None for x in (v, lambda_v, k, q, a, p, lam0, eta0)]
    y, y_var, lam, eta = _MobiusScan.apply(*args, decode_from_prior, config, precision_floor)
    return y, y_var, KLAState(lam, eta)


def _empty_scan(v: Tensor, state_size: int, lam0: Tensor | None, eta0: Tensor | None):
    """L = 0: empty outputs and the initial state unchanged (float32), as the reference returns."""
    batch, _, channels = v.shape
    if lam0 is None:
        lam0 = torch.ones(batch, channels, state_size, device=v.device)
        eta0 = torch.zeros_like(lam0)
    return v.clone(), v.clone(), KLAState(lam0.float(), eta0.float())
