"""Eager forward + backward of klalm's torch GDN path on the CPU, this tree's src/klalm/ops/gdn.py against HEAD's
(git show HEAD:...), each in its own process, in three alternating rounds: the median of 5 calls after one warm-up
(B 2, H 8, K 48, V 96, float32, chunks of 64, denormals flushed as in results/cpu_2026-12-04e), the number of
aten ops one forward + backward calls that compute or copy (`is_kernel`: on a GPU each is at least one
launch) and the bytes autograd saves for the backward.

    .venv/bin/python results/cpu_2026-12-04g/gdn_path_ab.py            # after committing: BASE=<commit> ...
"""

import os
import subprocess
import sys
import time
import types
from pathlib import Path

import torch
from torch.profiler import profile

ROOT = Path(__file__).parents[2]
sys.path[:0] = [str(ROOT / "results" / "cpu_2026-12-04c"), str(ROOT / "results" / "cpu_2026-12-04e")]
from gdn_loop_time import inputs  # noqa: E402  (the same inputs as the earlier GDN timings)
from gdn_state_pass_time import alternating_rounds  # noqa: E402  (the same child-process harness)

BASE = os.environ.get("BASE", "HEAD")
VARIANTS = {"before": BASE, "after": None}  # the commit of each gdn.py; None: this tree's
LENGTHS = (1024, 2048, 4096)


def variant_source(name: str) -> str:
    commit = VARIANTS[name]
    if commit is None:
        return (ROOT / "src" / "klalm" / "ops" / "gdn.py").read_text()
    show = ["git", "-C", str(ROOT), "show", f"{commit}:src/klalm/ops/gdn.py"]
    return subprocess.run(show, capture_output=True, text=True, check=True).stdout


VIEWS = {
    "as_strided",
    "select",
    "slice",
    "view",
    "reshape",
    "expand",
    "unsqueeze",
    "squeeze",
    "transpose",
    "t",
    "permute",
    "unflatten",
    "split",
    "split_with_sizes",
    "unbind",
    "alias",
    "detach",
    "resolve_conj",
    "empty",
    "empty_like",
    "empty_strided",
    "movedim",
    "narrow",
    "_unsafe_view",
    "diagonal",
    "lift_fresh",
    "_reshape_alias",
    "new_empty",
    "resize_",
    "to",
}  # "to" without a copy inside returns its input


# one library call each on a GPU (cuBLAS); on the CPU they may loop over the batch with per-matrix copies inside
LIBRARY = {"linalg_solve_triangular", "bmm", "mm", "addmm", "baddbmm"}


def is_kernel(event) -> bool:
    """An aten op that computes or copies (not a view or an allocation) and calls no other such op (the leaves of
    composite ops like matmul, whose internal copies count), or a `LIBRARY` op as a whole: about one kernel each on
    a GPU."""
    name = event.name.removeprefix("aten::")
    if not event.name.startswith("aten::") or name in VIEWS:
        return False
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.removeprefix("aten::") in LIBRARY:
            return False
        parent = parent.cpu_parent
    return name in LIBRARY or not any(is_kernel_like(child) for child in event.cpu_children)


def is_kernel_like(event) -> bool:
    name = event.name.removeprefix("aten::")
    if not event.name.startswith("aten::"):
        return False
    return name not in VIEWS or any(is_kernel_like(child) for child in event.cpu_children)


def measure(name: str) -> list[tuple[int, float, int, float]]:
    """(T, f+b ms, aten kernels, saved MB) per length."""
    module = sys.modules[f"gdn_{name}"] = types.ModuleType(f"gdn_{name}")
    exec(compile(variant_source(name), f"gdn_{name}.py", "exec"), module.__dict__)
    torch.set_flush_denormal(True)
    rows = []
    for length in LENGTHS:
        x = inputs(length)

        def step(x: list[torch.Tensor] = x) -> None:
            o, h = module.gated_delta_rule_torch(*x, None, 0.25)
            (o.sum() + h.sum()).backward()

        times = []
        for _ in range(6):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        with profile() as prof:
            step()
        kernels = sum(map(is_kernel, prof.events()))
        saved: list = []

        def pack(t: torch.Tensor, saved: list = saved) -> torch.Tensor:
            saved.append(t.untyped_storage())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module.gated_delta_rule_torch(*x, None, 0.25)
        unique = {s.data_ptr(): s.nbytes() for s in saved}
        rows.append((length, 1e3 * sorted(times[1:])[2], kernels, sum(unique.values()) / 2**20))
    return rows


def main() -> None:
    results = alternating_rounds(__file__, list(VARIANTS), rounds=3)
    print("| T | before f+b ms | after f+b ms | aten kernels before / after | saved MB before / after |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for i, length in enumerate(LENGTHS):
        before, after = ([r[i] for r in results[n]] for n in VARIANTS)
        cells = [" / ".join(f"{r[1]:.1f}" for r in rows) for rows in (before, after)]
        cells.append(f"{before[0][2]} / {after[0][2]}")
        cells.append(f"{before[0][3]:.0f} / {after[0][3]:.0f}")
        print(f"| {length} | " + " | ".join(cells) + " |")
    print(f"\nThree rounds each (round 1 / 2 / 3). before = {BASE}'s gdn.py, after = this tree's.")
    threads = torch.get_num_threads()
    print(f"B 2, H 8, K 48, V 96, float32, denormals flushed, {threads} threads, torch {torch.__version__}.")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(repr(measure(sys.argv[1])))
    else:
        main()
