"""Input validation for the KLA scan: shapes and dtypes always, values where they cost no device sync.

Shape and dtype checks read only metadata, so every call runs them. Value checks (Λ > 0, a in (0, 1],
p ≥ 0, everything finite, λ_0 > 0) reduce whole tensors to one boolean; on a GPU that is a device
synchronisation, so they run on CPU tensors always and on CUDA tensors only when the environment
variable `KLALM_CHECK_INPUTS=1` is set (a debug switch, never on in the training hot path). While
`torch.compile` traces a model they are skipped: a data-dependent check would split its graph, and at trace
time there are no values to check (run the model eagerly to check them).
Every error is a ValueError that names the tensor and the rule it broke.

Training switches the default value checks off (`value_checks_suspended`): there a non-finite input can only come
from a diverging model, and it must reach the loss, where the training step skips and counts it on every device
and for every architecture alike. `KLALM_CHECK_INPUTS=1` still checks inside training (to find the first bad value).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torch import Tensor

CHECK_ENV_VAR = "KLALM_CHECK_INPUTS"
_suspended: ContextVar[bool] = ContextVar("klalm_value_checks_suspended", default=False)


@contextlib.contextmanager
def value_checks_suspended() -> Iterator[None]:
    """Within this context only `$KLALM_CHECK_INPUTS=1` turns value checks on (see the module docstring)."""
    token = _suspended.set(True)
    try:
        yield
    finally:
        _suspended.reset(token)


def value_checks_enabled(device: torch.device, force: bool = False) -> bool:
    """Whether value checks run: never while torch.compile traces; always under $KLALM_CHECK_INPUTS=1;
    otherwise, outside `value_checks_suspended`, on CPU tensors or when `force` (the reference backend)."""
    if torch.compiler.is_compiling():
        return False
    if os.environ.get(CHECK_ENV_VAR, "0") == "1":
        return True
    return not _suspended.get() and (force or device.type == "cpu")


def _check_float(name: str, x: Tensor, device: torch.device) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but v is on {device}; all inputs must share one device")


def _check_shape(name: str, x: Tensor, expected: tuple[int, ...], letters: str) -> None:
    if tuple(x.shape) != expected:
        want = "[" + ", ".join(f"{c}={n}" for c, n in zip(letters.split(","), expected)) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(x.shape)}")


def check_shapes(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    lam0: Tensor | None,
    eta0: Tensor | None,
    *,
    step: bool = False,
    lambda_name: str = "lambda_v",
) -> None:
    """Check shapes, dtypes and devices of scan (or, with `step`, one-token) inputs.

    Args:
        v, lambda_v: [B, L, M] ([B, M] when `step`); `lambda_name` names the second in errors ("logvar" when it
            holds log σ²).
        k, q: [B, L, S] ([B, S] when `step`).
        a, p: [M, S].
        lam0, eta0: state tensors [B, M, S], or None for a fresh sequence.
        step: whether the inputs are one token without the time axis.

    Raises:
        ValueError: naming the first tensor whose rank, shape, dtype or device is wrong.
    """
    _check_float("v", v, v.device)
    rank, letters = (2, "B,M") if step else (3, "B,L,M")
    if v.dim() != rank:
        raise ValueError(f"v must have shape [{letters}] (rank {rank}), got {list(v.shape)}")
    for name, x in ((lambda_name, lambda_v), ("k", k), ("q", q), ("a", a), ("p", p)):
        _check_float(name, x, v.device)
    _check_shape(lambda_name, lambda_v, tuple(v.shape), letters)
    if k.dim() != rank:
        raise ValueError(f"k must have rank {rank} ([{letters[:-1]}S]), got {list(k.shape)}")
    s = k.shape[-1]
    lead = tuple(v.shape[:-1])
    _check_shape("k", k, (*lead, s), letters[:-1] + "S")
    _check_shape("q", q, (*lead, s), letters[:-1] + "S")
    m = v.shape[-1]
    _check_shape("a", a, (m, s), "M,S")
    _check_shape("p", p, (m, s), "M,S")
    for name, x in (("initial_state.lam", lam0), ("initial_state.eta", eta0)):
        if x is not None:
            _check_float(name, x, v.device)
            _check_shape(name, x, (v.shape[0], m, s), "B,M,S")


def _require(ok: Tensor, name: str, rule: str) -> None:
    if not bool(ok):
        raise ValueError(f"{name} breaks the rule: {rule}")


def check_values(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    lam0: Tensor | None,
    eta0: Tensor | None,
    *,
    lambda_name: str = "lambda_v",
) -> None:
    """Check the value rules of the filter (costs a device sync on GPU; see `value_checks_enabled`).

    lambda_name "logvar": the second tensor holds log σ² (any finite value) instead of Λ.

    Raises:
        ValueError: naming the tensor and the rule (finite, Λ > 0, a in (0, 1], p ≥ 0, λ_0 > 0).
    """
    named = {"v": v, lambda_name: lambda_v, "k": k, "q": q, "a": a, "p": p}
    if lam0 is not None:
        named |= {"initial_state.lam": lam0, "initial_state.eta": eta0}
    for name, x in named.items():
        _require(torch.isfinite(x.detach()).all(), name, "all values finite (no NaN or inf)")
    if lambda_name == "lambda_v":
        _require((lambda_v.detach() > 0).all(), "lambda_v", "value precision Λ > 0")
    a_ = a.detach()
    _require(((a_ > 0) & (a_ <= 1)).all(), "a", "discrete decay a in (0, 1]")
    _require((p.detach() >= 0).all(), "p", "discrete process noise p >= 0")
    if lam0 is not None:
        _require((lam0.detach() > 0).all(), "initial_state.lam", "posterior precision λ_0 > 0")


def check_inputs(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    state,
    *,
    step: bool = False,
    force_values: bool = False,
    lambda_name: str = "lambda_v",
) -> None:
    """Shape/dtype checks always; value checks as `value_checks_enabled` decides.

    Args:
        state: a `KLAState` (lam, eta) or None.
        step: one-token inputs ([B, M] and [B, S]) instead of sequences.
        force_values: run the value checks on any device (the reference backend does).
        lambda_name: "logvar" when the second tensor holds log σ² (finite, any sign) instead of Λ.
    """
    lam0, eta0 = (None, None) if state is None else (state[0], state[1])
    check_shapes(v, lambda_v, k, q, a, p, lam0, eta0, step=step, lambda_name=lambda_name)
    if value_checks_enabled(v.device, force=force_values):
        check_values(v, lambda_v, k, q, a, p, lam0, eta0, lambda_name=lambda_name)
