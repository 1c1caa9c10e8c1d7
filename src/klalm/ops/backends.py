"""How every op picks its backend: `kla_scan`, `selective_scan` and `gated_delta_rule` follow one policy.

Each op has a table of backends that share one signature: "reference" (the sequential oracle), "torch" (the chunked
torch path, any device) and one fast GPU path ("triton", or "fla" for the gated delta rule). A request means:

- a name from the table: that backend, always. If it cannot run (the fast path on CPU tensors, say), it raises; a
  named backend never falls back to another.
- "auto": the fast path for CUDA tensors of float32 or narrower, when it can run on that device (its module imports;
  the fla path must also pass a probe against the torch path); "torch" otherwise. float64 always goes to "torch":
  the fast paths compute in float32, and float64 callers ask for float64 accuracy.

"auto" decides once per (op, device, dtype) and logs its choice once: INFO, or WARNING with the reason when a CUDA
device falls back to "torch". `recording()` collects which backend every call inside it ran (results record it).

Deciding logs and may probe the device; inside torch.compile's trace either would split the compiled graph, and
the split stays for as long as the compiled code runs. So code that compiles a model calls `prepare(op, device)`
first (`klalm.models.prepare_backends` does it for every mixer of a model): the choice is then made, and a traced call
only reads it. A choice made inside a trace all the same is logged at the next call outside one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch

log = logging.getLogger(__name__)


class OpBackends:
    """The backends of one op.

    Args:
        op: the op's name, used in messages ("kla_scan").
        table: backend name -> function; holds "reference", "torch" and `fast`.
        fast: the name of the fast GPU path ("triton" or "fla").
        usable: `usable(device) -> (can run, reason)` for the fast path on a CUDA device.
    """

    def __init__(
        self, op: str, table: dict[str, Callable], fast: str, usable: Callable[[torch.device], tuple[bool, str]]
    ):
        if not {"reference", "torch", fast} <= table.keys():
            raise ValueError(f"{op}: a backend table needs 'reference', 'torch' and {fast!r}; got {sorted(table)}")
        self.op, self.table, self.fast, self.usable = op, table, fast, usable


_AUTO: dict[tuple[str, str, torch.dtype], str] = {}  # (op, device, dtype) -> choice (a dict: dynamo traces it)
_RECORDS: list[dict[str, str]] = []  # the open `recording()` blocks, innermost last
_UNLOGGED: list[tuple[int, tuple]] = []  # (level, log arguments) of choices made inside a torch.compile trace
NARROW_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # "auto" decides the same for each of these


@contextlib.contextmanager
def recording() -> Iterator[dict[str, str]]:
    """Collect "<op> <device> <dtype>" -> backend name for every op call resolved inside the block."""
    used: dict[str, str] = {}
    _RECORDS.append(used)
    try:
        yield used
    finally:
        _RECORDS.remove(used)


def resolve_backend(backends: OpBackends, backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """The backend name that `backend` means for tensors on `device` of `dtype` (see the module docstring).

    Raises:
        ValueError: `backend` is neither "auto" nor in the table; the message lists the valid names.
    """
    if not torch.compiler.is_compiling() and _UNLOGGED:  # in this order: a trace never reads the list
        for level, args in _UNLOGGED:
            log.log(level, *args)
        _UNLOGGED.clear()
    if backend != "auto":
        if backend not in backends.table:
            raise ValueError(f"unknown {backends.op} backend {backend!r}; valid: {sorted(backends.table) + ['auto']}")
        name = backend
    else:
        name = _auto_choice(backends, device, dtype)
    for used in _RECORDS:
        used[f"{backends.op} {device} {str(dtype).removeprefix('torch.')}"] = name
    return name


def _auto_choice(backends: OpBackends, device: torch.device, dtype: torch.dtype) -> str:
    key = (backends.op, str(device), dtype)
    if key not in _AUTO:
        _AUTO[key] = _decide(backends, device, dtype)
    return _AUTO[key]


def _decide(backends: OpBackends, device: torch.device, dtype: torch.dtype) -> str:
    if device.type != "cuda":
        usable, reason = False, f"{device.type} tensors"
    elif dtype == torch.float64:
        usable, reason = False, "float64 tensors"
    else:
        usable, reason = backends.usable(device)
    name = backends.fast if usable else "torch"
    level = logging.WARNING if device.type == "cuda" and dtype != torch.float64 and not usable else logging.INFO
    args = ("%s backend 'auto' on %s %s: %r (%s)", backends.op, device, dtype, name, reason)
    if torch.compiler.is_compiling():  # a log call would split the graph being traced
        _UNLOGGED.append((level, args))
    else:
        log.log(level, *args)
    return name


def prepare(backends: OpBackends, device: torch.device) -> None:
    """Make the "auto" choice of `backends` on `device` now for each of `NARROW_DTYPES` (one decision, one log line,
    one probe: the choice does not depend on which), so that calls traced later by torch.compile only read it (the
    module docstring says why). float64 is left to its first call."""
    if device.type == "cuda" and device.index is None:  # tensors name their device with its index ("cuda:0")
        device = torch.device("cuda", torch.cuda.current_device())
    narrow = _auto_choice(backends, device, torch.float32)
    for dtype in NARROW_DTYPES:
        _AUTO.setdefault((backends.op, str(device), dtype), narrow)
