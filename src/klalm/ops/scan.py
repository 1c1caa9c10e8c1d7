"""Public entry points of the KLA scan: `kla_scan`, `kla_scan_logvar`, `kla_step`, and the table of backends `BACKENDS`.

Backends share one signature, `fn(v, lambda_v, k, q, a, p, initial_state, decode_from_prior)`, and one
return convention, `(y, y_var, KLAState(lam, eta))`:

- "reference": the sequential loop of `klalm.ops.reference` (the oracle; any float dtype, float64 included).
- "torch": the chunked parallel scan of `klalm.ops.chunked_scan` with its exact hand-derived backward (CPU, GPU).
- "triton": the fused GPU kernels `klalm.kernels.mobius_scan.kla_scan_triton`, imported on first use.
- "auto" (not a table entry): "triton" for CUDA tensors below float64 when the kernels import, "torch" otherwise;
  the policy of all three ops, in `klalm.ops.backends`.

`kla_scan_logvar` takes log σ² instead of Λ (the KLA layer's sensor); the Triton kernels form
Λ = 1/(softplus(log σ²) + floor) as they load it, the other backends through `precision_from_logvar`.
`variance=False` (both scans) returns None for y_var: the Triton kernels then skip it, the other backends drop it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from klalm.ops.backends import OpBackends, resolve_backend
from klalm.ops.checks import check_inputs
from klalm.ops.chunked_scan import kla_scan_torch
from klalm.ops.common import KLAState, compute_dtype, precision_from_logvar
from klalm.ops.reference import kla_scan_reference, kla_step_reference


def _kla_scan_triton(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    initial_state: KLAState | None,
    decode_from_prior: bool,
    precision_floor: float | None = None,
    variance: bool = True,
) -> tuple[Tensor, Tensor | None, KLAState]:
    """Lazy entry of the Triton backend: import it on first use. It needs CUDA tensors (or Triton's CPU interpreter,
    TRITON_INTERPRET=1); `kla_scan_triton` raises a ValueError otherwise.

    A plain import statement, not importlib: torch.compile traces through it without a graph break.
    """
    try:
        from klalm.kernels.mobius_scan import kla_scan_triton
    except ImportError as err:
        raise RuntimeError(f"kla_scan backend 'triton' is unavailable: cannot import klalm.kernels ({err})") from err
    return kla_scan_triton(
        v, lambda_v, k, q, a, p, initial_state, decode_from_prior, precision_floor=precision_floor, variance=variance
    )


def _triton_usable(device: torch.device) -> tuple[bool, str]:
    """Whether the Triton kernels import (the "auto" test of `klalm.ops.backends`)."""
    try:
        from klalm.kernels.mobius_scan import kla_scan_triton  # noqa: F401
    except ImportError as err:
        return False, f"cannot import klalm.kernels.mobius_scan: {err}"
    return True, "the Triton kernels import"


BACKENDS: dict[str, Callable[..., tuple[Tensor, Tensor, KLAState]]] = {
    "reference": kla_scan_reference,
    "torch": kla_scan_torch,
    "triton": _kla_scan_triton,
}
KLA_SCAN_OP = OpBackends("kla_scan", BACKENDS, fast="triton", usable=_triton_usable)


def kla_scan(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    initial_state: KLAState | None = None,
    *,
    backend: str = "auto",
    decode_from_prior: bool = False,
    variance: bool = True,
) -> tuple[Tensor, Tensor | None, KLAState]:
    """Run the KLA filter (docs/kla.md) over a sequence; differentiable in every tensor argument.

    Per (b, m, s): φ_t = Λ_t·k_t², r_t = v_t·Λ_t·k_t, d_t = a² + p·λ_{t-1}, λ_t = λ_{t-1}/d_t + φ_t,
    η_t = (a/d_t)·η_{t-1} + r_t; y_t = Σ_s q_t·η_t/λ_t, y_var_t = Σ_s q_t²/λ_t.

    Args:
        v: values, [B, L, M], any float dtype (bf16/fp16/fp32 computed in float32, float64 in float64).
        lambda_v: value precisions Λ, [B, L, M], > 0 (finite).
        k: keys (observation map), [B, L, S], finite; k = 0 is a valid "no information" step.
        q: queries (readout), [B, L, S], finite.
        a: discrete decay, [M, S], in (0, 1].
        p: discrete process noise, [M, S], ≥ 0.
        initial_state: `KLAState(lam, eta)`, each [B, M, S] with lam > 0; None means λ_0 = 1, η_0 = 0.
        backend: "auto", "reference", "torch" or "triton" (`klalm.ops.backends` says what "auto" picks).
        decode_from_prior: read out the one-step-ahead prediction a·μ_t, a²·σ²_t + p instead of μ_t, σ²_t.
        variance: False returns None for y_var (a KLA layer in training reads y only); the Triton kernels then do
            not compute it.

    Returns:
        y: posterior-mean readout, [B, L, M], in v's dtype.
        y_var: readout variance, [B, L, M], in v's dtype, > 0 (None when `variance` is False).
        state: final `KLAState(lam, eta)`, each [B, M, S], float32 (float64 for float64 inputs).

    Raises:
        ValueError: a bad shape, dtype or device (always), a broken value rule (Λ ≤ 0, a outside (0, 1],
            p < 0, non-finite; checked on CPU and, with KLALM_CHECK_INPUTS=1, on GPU; always for the
            reference backend), or an unknown backend.
    """
    name = resolve_backend(KLA_SCAN_OP, backend, v.device, v.dtype)
    if name != "triton":  # the Triton entry (`kla_scan_triton`) runs the same checks itself
        check_inputs(v, lambda_v, k, q, a, p, initial_state, force_values=name == "reference")
    if name == "triton":
        return _kla_scan_triton(v, lambda_v, k, q, a, p, initial_state, decode_from_prior, variance=variance)
    y, y_var, state = BACKENDS[name](v, lambda_v, k, q, a, p, initial_state, decode_from_prior)
    return y, y_var if variance else None, state


def kla_scan_logvar(
    v: Tensor,
    logvar: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    initial_state: KLAState | None = None,
    *,
    precision_floor: float,
    backend: str = "auto",
    decode_from_prior: bool = False,
    variance: bool = True,
) -> tuple[Tensor, Tensor | None, KLAState]:
    """`kla_scan` with the value precision given as log σ²: Λ = 1/(softplus(log σ²) + precision_floor).

    The Triton backend forms Λ inside its kernels as it loads log σ² (in its own dtype, e.g. bf16), so no float32
    [B, L, M] Λ, its softplus or its reciprocal is ever written; the other backends compute Λ with
    `precision_from_logvar` and call `kla_scan`. Same arguments and results as `kla_scan` otherwise.

    Args:
        logvar: log σ² of the values, [B, L, M], finite (any sign); differentiable.
        precision_floor: > 0; caps Λ at 1/precision_floor (the KLA layer uses 1e-4).
    """
    if not precision_floor > 0:
        raise ValueError(f"precision_floor must be > 0, got {precision_floor}")
    name = resolve_backend(KLA_SCAN_OP, backend, v.device, v.dtype)
    if name != "triton":
        lambda_v = precision_from_logvar(logvar, precision_floor)
        return kla_scan(
            v, lambda_v, k, q, a, p, initial_state, backend=name, decode_from_prior=decode_from_prior, variance=variance
        )
    return _kla_scan_triton(v, logvar, k, q, a, p, initial_state, decode_from_prior, precision_floor, variance)


def kla_step(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    state: KLAState,
    *,
    decode_from_prior: bool = False,
) -> tuple[Tensor, Tensor, KLAState]:
    """One decode step of the filter, O(1) in the sequence length; same math and rules as `kla_scan`.

    Args:
        v, lambda_v: [B, M] (lambda_v > 0).
        k, q: [B, S].
        a: [M, S] in (0, 1]; p: [M, S], ≥ 0.
        state: `KLAState(lam, eta)`, each [B, M, S] (lam > 0), e.g. the state a `kla_scan` returned.
        decode_from_prior: as in `kla_scan`.

    Returns:
        (y [B, M], y_var [B, M]) in v's dtype and the new state in the compute dtype.
    """
    check_inputs(v, lambda_v, k, q, a, p, state, step=True)
    out_dtype, dt = v.dtype, compute_dtype(v.dtype)
    v, lambda_v, k, q, a, p = (x.to(dt) for x in (v, lambda_v, k, q, a, p))
    y, y_var, new_state = kla_step_reference(
        v, lambda_v, k, q, a, p, KLAState(state[0].to(dt), state[1].to(dt)), decode_from_prior
    )
    return y.to(out_dtype), y_var.to(out_dtype), new_state
