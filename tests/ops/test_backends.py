"""klalm.ops.backends: `recording` says which backend each op call ran, for the results that record it; `prepare`
and the choices made inside a torch.compile trace."""

from __future__ import annotations

import pytest
import torch

from klalm.ops import backends, kla_scan
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


def test_prepare_decides_every_narrow_dtype_at_once_logs_once_and_records_nothing(monkeypatch, caplog):
    monkeypatch.setattr(backends, "_AUTO", {})
    probes = []
    op = backends.OpBackends("toy", {"reference": None, "torch": None, "fast": None}, "fast",
                             usable=lambda device: (probes.append(device) or True, "toy probe"))  # fmt: skip
    with recording() as used, caplog.at_level("INFO", logger="klalm.ops.backends"):
        backends.prepare(op, torch.device("cpu"))
    assert used == {} and len(caplog.records) == 1 and probes == []  # CPU: "torch" without a probe
    assert {dtype: backends._AUTO[("toy", "cpu", dtype)] for dtype in backends.NARROW_DTYPES} == dict.fromkeys(
        backends.NARROW_DTYPES, "torch"
    )


def test_a_choice_made_inside_a_compile_trace_is_logged_at_the_next_eager_call(monkeypatch, caplog):
    """Logging inside torch.compile's trace would split the graph: the line waits for the next call outside one."""
    monkeypatch.setattr(backends, "_AUTO", {})
    monkeypatch.setattr(backends, "_UNLOGGED", [])
    torch._dynamo.reset()
    with caplog.at_level("INFO", logger="klalm.ops.backends"):
        explanation = torch._dynamo.explain(_scan)("auto")
        assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
        assert caplog.records == [] and len(backends._UNLOGGED) == 1
        _scan("reference")
    torch._dynamo.reset()
    assert [r.getMessage() for r in caplog.records] == [
        "kla_scan backend 'auto' on cpu torch.float32: 'torch' (cpu tensors)"
    ]
    assert backends._UNLOGGED == []


@pytest.mark.gpu
def test_prepare_names_a_cuda_device_by_its_index(monkeypatch):
    """The synthetic runner passes torch.device("cuda"); the ops see tensors on "cuda:0"."""
    monkeypatch.setattr(backends, "_AUTO", {})
    op = backends.OpBackends("toy", {"reference": None, "torch": None, "fast": None}, "fast", lambda d: (True, "ok"))
    backends.prepare(op, torch.device("cuda"))
    assert backends._AUTO[("toy", f"cuda:{torch.cuda.current_device()}", torch.bfloat16)] == "fast"
