"""klalm.ops.backends: `recording` says which backend each op call ran, for the results that record it."""

from __future__ import annotations

import torch

from klalm.ops import kla_scan
from klalm.ops.backends import recording
from klalm.ops.common import fresh_state


def _scan(backend: str, dtype: torch.dtype = torch.float32) -> None:
    b, length, m, s = 1, 3, 2, 2
    v, lam = torch.randn(b, length, m, dtype=dtype), torch.rand(b, length, m, dtype=dtype) + 0.5
    k = q = torch.randn(b, length, s, dtype=dtype)
    a, p = torch.full((m, s), 0.9, dtype=dtype), torch.full((m, s), 0.1, dtype=dtype)
    kla_scan(v, lam, k, q, a, p, fresh_state(b, m, s, "cpu", dtype), backend=backend)


def test_recording_collects_the_backend_of_each_call_inside_it_only():
    _scan("auto")
    with recording() as outer:
        _scan("auto")
        with recording() as inner:
            _scan("reference", torch.float64)
    _scan("reference")
    assert outer == {"kla_scan cpu float32": "torch", "kla_scan cpu float64": "reference"}
    assert inner == {"kla_scan cpu float64": "reference"}
