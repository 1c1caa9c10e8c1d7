"""scripts/bench_synthetic.py: skips cleanly without CUDA, and its tables (eager columns, members in one process,
processes side by side) on the CPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from klalm.tasks.results import read_jsonl

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_synthetic.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_synthetic", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_without_cuda_it_says_so_and_exits_zero():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "no CUDA device: nothing measured" in done.stdout


@pytest.fixture
def one_thread():
    """The box these tests run on is shared: spinning OpenMP threads under load make eager steps 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cpu_tables_cover_every_option(tmp_path, capsys, one_thread):
    rates = tmp_path / "rates.jsonl"
    _bench().main(["--device", "cpu", "--archs", "gpt,bogus", "--depths", "1", "--side-archs", "gpt", "--members",
                   "2", "--procs", "2", "--batch-size", "4", "--length", "4", "--seconds", "0.2", "--rates",
                   str(rates)])  # fmt: skip
    out = capsys.readouterr().out
    assert "| gpt | 1 | " in out and "| — | — |" in out  # eager measured, nothing captured on the CPU
    assert "| bogus | 1 | error: ValueError: unknown arch 'bogus'" in out  # one failure, the rest still runs
    assert "| gpt | 2 seeds, one process | " in out and "| gpt | 2 processes, one seed each | " in out
    assert "error" not in out.split("seeds side by side")[1]
    assert not rates.exists()  # only captured measurements are rates for the runner


def test_compiled_measurements_and_their_rates_name_the_backend(tmp_path, one_thread):
    bench = _bench()
    args = bench.parse_args(["--batch-size", "4", "--length", "4"])
    unit = bench.a5_unit(args, "gpt", 1, 1)
    got = bench.measure(unit, torch.device("cpu"), False, 0.2, "aot_eager")
    assert got["steps_per_s"] > 0 and not got["captured"]
    rates = tmp_path / "rates.jsonl"
    for backend in ("inductor", None):
        bench.append_rate(rates, unit, torch.device("cpu"), True, 1, 0.01, 1.0, backend)
    assert [line["compile_backend"] for line in read_jsonl(rates)] == ["inductor", None]
