"""Eager time of klalm's torch GDN path on the CPU with denormals flushed, by chunk count (B 2, H 8, K 48, V 96,
float32, chunks of 64; median of 5 calls after one warm-up), for three ways of passing the state between chunks,
each in its own process, in two alternating rounds:

- loop: a Python loop over the chunks, `git show 397be0f:src/klalm/ops/gdn.py`
- scan: a log-depth (Hillis–Steele) scan, levels checkpointed, `git show 94ea0e4:src/klalm/ops/gdn.py`
- groups: about √N groups of about √N chunks (this tree's src/klalm/ops/gdn.py)

Why flushed: the gates decay the maps' products below float32's normal range (e^{γ_C} over a 64-token chunk is
about e^{-32} with these inputs), and a CPU computes with denormal numbers many times slower than with normal ones
(a GPU does not), which made the unflushed timings of results/cpu_2026-12-04c depend on how many products each
variant forms in the denormal band rather than on its work.

    .venv/bin/python results/cpu_2026-12-04e/gdn_state_pass_time.py
"""

import subprocess
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "results" / "cpu_2026-12-04c"))
from gdn_loop_time import inputs  # noqa: E402  (the same inputs as that folder's timings)

VARIANTS = {"loop": "397be0f", "scan": "94ea0e4", "groups": None}  # the commit of each gdn.py; None: this tree's


def variant_source(name: str) -> str:
    commit = VARIANTS[name]
    if commit is None:
        return (ROOT / "src" / "klalm" / "ops" / "gdn.py").read_text()
    show = ["git", "-C", str(ROOT), "show", f"{commit}:src/klalm/ops/gdn.py"]
    return subprocess.run(show, capture_output=True, text=True, check=True).stdout


def time_variant(name: str) -> list[tuple[int, float, float]]:
    module = sys.modules[f"gdn_{name}"] = types.ModuleType(f"gdn_{name}")
    exec(compile(variant_source(name), f"gdn_{name}.py", "exec"), module.__dict__)
    torch.set_flush_denormal(True)
    rows = []
    for length in (512, 1024, 2048, 4096):
        x = inputs(length)
        fwd, both = [], []
        for _ in range(6):
            start = time.perf_counter()
            out = module.gated_delta_rule_torch(*x, None, 0.25)[0]
            mid = time.perf_counter()
            out.sum().backward()
            fwd.append(mid - start)
            both.append(time.perf_counter() - start)
        rows.append((length, 1e3 * sorted(fwd[1:])[2], 1e3 * sorted(both[1:])[2]))
    return rows


def alternating_rounds(script: str, names: list[str], rounds: int) -> dict[str, list]:
    """Runs `script <name>` for every name in turn, `rounds` times, each in its own process; name -> the rows each
    run printed (the child's repr of its rows), round by round."""
    results: dict[str, list] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            out = subprocess.run([sys.executable, script, name], capture_output=True, text=True, check=True).stdout
            results[name].append(eval(out))
    return results


def main() -> None:
    results = alternating_rounds(__file__, list(VARIANTS), rounds=2)
    print("| T | chunks of 64 | " + " | ".join(f"{n} fwd ms | {n} f+b ms" for n in VARIANTS) + " |")
    print("| ---: | ---: |" + " ---: | ---: |" * len(VARIANTS))
    for i, length in enumerate((512, 1024, 2048, 4096)):
        cells = []
        for name in VARIANTS:
            fwd = " / ".join(f"{r[i][1]:.1f}" for r in results[name])
            both = " / ".join(f"{r[i][2]:.1f}" for r in results[name])
            cells += [fwd, both]
        print(f"| {length} | {length // 64} | " + " | ".join(cells) + " |")
    threads = torch.get_num_threads()
    print("\nTwo rounds each (round 1 / round 2). B 2, H 8, K 48, V 96, float32, denormals flushed,")
    print(f"{threads} threads, torch {torch.__version__}.")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(repr(time_variant(sys.argv[1])))
    else:
        main()
