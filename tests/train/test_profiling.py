"""ProfileSteps: one training step under torch.profiler, broken down by category (scan, matmul, optimizer, ...)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from klalm.train.app import run
from klalm.train.profiling import CATEGORIES, OTHER, ProfileSteps, breakdown, categorize, gpu_idle_table

from .conftest import TINY, compose_train

KERNEL_NAMES = {  # names as torch.profiler reports them on an H100/H200 (CUDA 12/13) or for CPU operators
    "_kla_fwd_kernel": "scan",
    "_kla_bwd_summary_kernel": "scan",
    "_ss_bwd_kernel": "scan",
    "klalm::kla_scan_fwd": "scan",
    "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4>>": "attention",
    "fmha_cutlassB_bf16_aligned_64x64_k64_sm80": "attention",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1": "matmul",
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT": "matmul",
    "triton_tem_fused_mm_0": "matmul",
    "aten::addmm": "matmul",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
    "Optimizer.step#AdamW.step": "optimizer",
    "Memcpy HtoD (Pageable -> Device)": "data",
    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__": "data",
    "triton_poi_fused_add_mul_silu_0": OTHER,
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float>>": OTHER,
    "aten::mul": OTHER,
}


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_categories_of_real_kernel_names(name):
    assert categorize(name) == KERNEL_NAMES[name]


def _gpu_event(name: str, start_us: float, end_us: float, annotation: bool = False) -> SimpleNamespace:
    span = SimpleNamespace(start=start_us, end=end_us, elapsed_us=lambda: end_us - start_us)
    return SimpleNamespace(name=name, device_type=DeviceType.CUDA, time_range=span, is_user_annotation=annotation)


def _cpu_event(name: str, start_us: float, end_us: float, children: tuple = ()) -> SimpleNamespace:
    span = SimpleNamespace(start=start_us, end=end_us, elapsed_us=lambda: end_us - start_us)
    return SimpleNamespace(name=name, device_type=DeviceType.CPU, time_range=span, cpu_children=list(children),
                           is_user_annotation=False)  # fmt: skip


def test_gpu_idle_table_finds_the_gaps_and_what_the_host_ran():
    """Kernels busy 0-2, 5-6 and 10-13 ms of a window from -0.5 ms (the first host operator) to 13 ms: idle 7.5 ms,
    in three stretches, longest first, each with the host's self time in it; the annotated span is not a kernel."""
    foreach = _cpu_event("aten::_foreach_mul_", 3000, 3500)
    events = [
        _gpu_event("nvjet_a", 0, 1000), _gpu_event("nvjet_b", 500, 2000), _gpu_event("triton_c", 5000, 6000),
        _gpu_event("_kla_bwd_kernel", 10000, 13000), _gpu_event("Optimizer.step#AdamW.step", 2000, 9000, True),
        _cpu_event("aten::linear", -500, 300), _cpu_event("Optimizer.step#AdamW.step", 2500, 4800, (foreach,)), foreach,
    ]  # fmt: skip
    lines = gpu_idle_table(events, steps=1).splitlines()
    assert lines[0] == "GPU busy 6.00 ms a step (the union of its kernels and copies), idle 7.50 ms of the 13.50 ms " \
        "profiled window"  # fmt: skip
    assert lines[4:] == [
        "| 1 | 4.00 | 6.50 | untraced 4.00 |",
        "| 2 | 3.00 | 2.50 | `Optimizer.step#AdamW.step` 1.80, `aten::_foreach_mul_` 0.50, untraced 0.70 |",
        "| 3 | 0.50 | 0.00 | `aten::linear` 0.50 |",
    ]
    assert gpu_idle_table([_cpu_event("aten::mm", 0, 10)], steps=1) == ""  # no device: nothing to say


def test_gpu_breakdown_leaves_out_annotated_spans():
    """The device-side span of `Optimizer.step` covers the optimiser's kernels; counting it too would double their
    time (the twelfth session's profiles did: 4.09 ms of "optimizer" was the span)."""
    events = [
        _gpu_event("Optimizer.step#AdamW.step", 0.0, 100.0, annotation=True),
        _gpu_event("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 0, 60),
        _gpu_event("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 60, 90),
        _gpu_event("triton_poi_fused_add_mul_silu_0", 100.0, 105.0),
    ]
    assert breakdown(events, on_gpu=True) == {"optimizer": (90.0, 2), OTHER: (5.0, 1)}


def test_profiles_one_step_of_a_tiny_run(tmp_path):
    """A tiny KLA run on the CPU writes the breakdown and the trace of step 2; the matmuls and the optimiser take
    time (the CPU's torch scan is elementwise operators, so its time counts as other here)."""
    out = tmp_path / "profile"
    overrides = [
        *TINY,
        "+callbacks.profile._target_=klalm.train.profiling.ProfileSteps",
        f"+callbacks.profile.out_dir={out}",
        "+callbacks.profile.start_step=2",
    ]
    run(compose_train(overrides, tmp_path / "run"))
    table = (out / "profile.md").read_text()
    assert (out / "trace.json").stat().st_size > 0
    by_category, largest = table.split("\n\n")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in by_category.splitlines()[2:]}
    assert {"scan", "matmul", "optimizer", "data", OTHER, "wall clock"} <= set(rows)
    for category in ("matmul", "optimizer", OTHER, "wall clock"):
        assert float(rows[category]) > 0, table
    top = [line.split(" | ") for line in largest.splitlines()[2:]]  # the largest operators, most time first
    assert largest.startswith("| operator (20 largest by time) |") and len(top) == 20
    times = [float(row[2]) for row in top]
    assert times == sorted(times, reverse=True) and times[0] > 0
    assert {row[1] for row in top} <= {category for category, _ in CATEGORIES} | {OTHER}
    busy = float(next(ms for name, ms in rows.items() if name.startswith("sum")))
    assert sum(times) <= busy + 0.01 * len(times)  # a part of the summed time (each number rounded to 0.01 ms)
    every = (out / "kernels.md").read_text().splitlines()  # every operator, the same 20 first
    assert every[0].startswith(f"| operator (all {len(every) - 2} by time) |") and len(every) - 2 > 20
    assert every[2:22] == largest.splitlines()[2:]


def test_bad_arguments():
    with pytest.raises(ValueError, match="steps >= 1"):
        ProfileSteps("out", steps=0)
