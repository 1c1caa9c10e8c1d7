"""kernels/bench_scan.py's new tables at tiny shapes on the CPU (interpreted kernels, every timing a single call):
the harness the GPU session runs must not fail there on an argument or a shape."""

from __future__ import annotations

import re

import pytest

from klalm.kernels import bench_scan
from klalm.kernels.common import ScanConfig


@pytest.fixture
def tiny_bench(monkeypatch):
    """bench_scan on the CPU at tiny shapes; `timed` runs each callable once and reports 1 ms."""
    calls = []

    def timed(fn):
        fn()
        calls.append(fn)
        return 1.0, 0.0

    monkeypatch.setattr(bench_scan, "DEVICE", "cpu")
    monkeypatch.setattr(bench_scan, "timed", timed)
    monkeypatch.setattr(bench_scan, "LENGTHS", (64,))
    monkeypatch.setattr(bench_scan, "LENGTHS_TOKENS", 64)  # B 1: two chunks of 32 steps, at half the cost of B 2
    monkeypatch.setattr(bench_scan, "WIDE", dict(channels=4, state=2))
    monkeypatch.setattr(bench_scan, "DTYPE_SHAPE", dict(batch=1, length=9, channels=4, state=2))
    monkeypatch.setattr(bench_scan, "SEGMENT_LENGTHS", (ScanConfig().chunk,))
    monkeypatch.setattr(bench_scan, "SEGMENT_SHAPES", [dict(batch=1, length=70, channels=4, state=2)])
    monkeypatch.setattr(bench_scan, "STATES_SHAPE", dict(batch=1, length=9, channels=4))
    monkeypatch.setattr(bench_scan, "STATES", (2, 5))
    monkeypatch.setattr(bench_scan, "STATE_SLICE", 2)
    return calls


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if re.match(r"\| \w", line)]


@pytest.mark.parametrize(
    "run, n_rows, n_timings",
    [("run_lengths", 2, 8), ("run_dtypes", 17, 49), ("run_segments", 1, 3), ("run_states", 5, 5)],
)
def test_tables_run_at_tiny_shapes(tiny_bench, capsys, run, n_rows, n_timings):
    getattr(bench_scan, run)()
    rows = [row for row in table_rows(capsys.readouterr().out) if row[0] not in ("L", "inputs", "shape", "S")]  # data
    assert len(rows) == n_rows and len(tiny_bench) == n_timings
    assert all(cell for row in rows for cell in row)


def test_tune_times_each_scan_from_its_own_default(tiny_bench, capsys, monkeypatch):
    from klalm.kernels.mobius_scan import DEFAULT_CONFIG as KLA_DEFAULT
    from klalm.kernels.selective_scan import DEFAULT_CONFIG as SS_DEFAULT

    monkeypatch.setattr(bench_scan, "MAIN", dict(batch=1, length=9, channels=4, state=2))
    monkeypatch.setattr(bench_scan, "TUNE", [dict(), dict(unroll=2), dict(chunk=64)])
    bench_scan.run_tune()
    labels = [row[0] for row in table_rows(capsys.readouterr().out) if not row[0].startswith("config")]
    kla, selective = ([tuple(c) for c in bench_scan.tune_configs(d)] for d in (KLA_DEFAULT, SS_DEFAULT))
    assert SS_DEFAULT.chunk == 64 and len(selective) == 2  # its chunk-64 variant is its default: timed once
    assert labels == [f"kla {c}" for c in kla] + [f"selective {c}" for c in selective]
    assert selective[0] == tuple(SS_DEFAULT) and kla[0] == tuple(KLA_DEFAULT) and len(kla) == 3


def test_write_asm_writes_each_kind_and_notes_what_cannot_be_made(tmp_path):
    class Asm(dict):
        def __missing__(self, kind):
            raise RuntimeError("cuobjdump not found")

    class Kernel:
        def __init__(self, ptx):
            self.asm = Asm(ttgir="#ttg", ptx=ptx)

    bench_scan.write_asm([Kernel(".version 8.0")], tmp_path / "one", "row0_bm32_fwd")
    assert (tmp_path / "one" / "row0_bm32_fwd.ptx").read_text() == ".version 8.0"
    assert (tmp_path / "one" / "row0_bm32_fwd.sass").read_text().startswith("not available: RuntimeError: cuobjdump")
    bench_scan.write_asm([Kernel("a"), Kernel("b")], tmp_path / "two", "row1_bm64_bwd")
    assert sorted(f.name for f in (tmp_path / "two").iterdir()) == [
        f"row1_bm64_bwd_{j}.{kind}" for j in (0, 1) for kind in ("ptx", "sass", "ttgir")]  # fmt: skip
    bench_scan.write_asm(None, tmp_path / "none", "row2")  # interpreted: nothing compiled, nothing written
    assert list((tmp_path / "none").iterdir()) == []
