"""Public entry points of the KLA scan: `kla_scan` and `kla_step`, and the table of backends.

This first version knows only the sequential reference; the parallel torch scan and the Triton kernels
register themselves in `BACKENDS` (see `klalm.ops.parallel` and `klalm.kernels`).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from klalm.ops.reference import KLAState, kla_scan_reference, kla_step_reference

BACKENDS: dict[str, Callable] = {"reference": kla_scan_reference}


def kla_scan(
    v: Tensor, lambda_v: Tensor, k: Tensor, q: Tensor, a: Tensor, p: Tensor,
    initial_state: KLAState | None = None, *, backend: str = "auto", decode_from_prior: bool = False,
) -> tuple[Tensor, Tensor, KLAState]:
    """Run the KLA filter over a sequence; see `klalm.ops.reference` for the math.

    Shapes: v, lambda_v [B, L, M]; k, q [B, L, S]; a, p [M, S]; initial_state tensors [B, M, S].
    Returns (y [B, L, M], y_var [B, L, M], KLAState(lam, eta)).
    """
    name = "reference" if backend == "auto" else backend
    if name not in BACKENDS:
        raise ValueError(f"unknown kla_scan backend {backend!r}; valid: {sorted(BACKENDS) + ['auto']}")
    return BACKENDS[name](v, lambda_v, k, q, a, p, initial_state, decode_from_prior)


def kla_step(
    v: Tensor, lambda_v: Tensor, k: Tensor, q: Tensor, a: Tensor, p: Tensor, state: KLAState,
    *, decode_from_prior: bool = False,
) -> tuple[Tensor, Tensor, KLAState]:
    """One decode step. Shapes: v, lambda_v [B, M]; k, q [B, S]; a, p [M, S]; state [B, M, S]."""
    return kla_step_reference(v, lambda_v, k, q, a, p, state, decode_from_prior)
