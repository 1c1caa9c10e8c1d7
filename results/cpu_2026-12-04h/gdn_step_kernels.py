"""How many kernels one eager training step of gdn_180m launches, counted on the CPU, against the GPU profile.

The thirty-second session's GPU profile of eager gdn_180m (results/gpu_2026-12-04g/gdn/profile_groups_gdn_180m.md,
klalm b40c857, B16 × T2048, bf16 autocast) counted 7,066 elementwise and other kernels and 1,173 matmul kernels a
step, about 700 a layer, which its notes set against the ~350 the CPU had counted for the GDN op alone. This counts
the same thing on the CPU for the whole model: one forward (with the loss) and backward of gdn_180m at B 1 × T 2048
(the count does not depend on B; it depends on T through the chunk count), under bf16 autocast as on the GPU
(argument 1) or without (0). `is_kernel` (results/cpu_2026-12-04g/gdn_path_ab.py): an aten op that computes or
copies and calls no other such op, cuBLAS-backed ops as one; about one GPU kernel each. The GPU's step also clips,
checks finiteness and runs fused AdamW (45 optimiser kernels, a few dozen more for the clip), which this does not.

    # each tree in its own process: this one and the one the GPU profile ran (b40c857)
    git worktree add /tmp/klalm_b40c857 b40c857
    for tree in /tmp/klalm_b40c857 .; do for ac in 0 1; do OMP_NUM_THREADS=2 PYTHONPATH=$tree/src \
      .venv/bin/python results/cpu_2026-12-04h/gdn_step_kernels.py $ac; done; done
    # the profiled tree's kernels by aten op (bf16), and the GPU profile's kernels by kind of name
    OMP_NUM_THREADS=2 PYTHONPATH=/tmp/klalm_b40c857/src \
      .venv/bin/python results/cpu_2026-12-04h/gdn_step_kernels.py 1 ops
    .venv/bin/python results/cpu_2026-12-04h/gdn_step_kernels.py gpu
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).parents[1] / "cpu_2026-12-04g"))
from gdn_path_ab import LIBRARY, is_kernel  # noqa: E402  (the counter of the GDN op's kernel counts)

import klalm  # noqa: E402
from klalm.models import build_model  # noqa: E402

GPU_KERNELS = "results/gpu_2026-12-04g/gdn/profile_groups_gdn_180m_gdn_180m_B16_T2048_eager_kernels.md"
GPU_KINDS = {  # kind -> words of a kernel's (truncated) name, tried in this order
    "copy": ("copy",),
    "possibly copy (name cut at `at::native::direct...`)": ("nocast<at::native::direct...",),
    "fill": ("Fill",),
    "reduction": ("reduce_kernel",),
    "matmul": ("gemm", "nvjet", "trsm", "xmma"),
    "optimiser": ("adam", "multi_tensor"),
}


def gpu_kinds() -> None:
    """The GPU profile's kernels a step by kind of name (its list of every kernel, with calls a step)."""
    kinds: Counter = Counter()
    for line in (Path(__file__).parents[2] / GPU_KERNELS).read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            kind = next((k for k, words in GPU_KINDS.items() if any(w in cells[0] for w in words)), "other")
            kinds[kind] += int(cells[-1].replace(",", ""))
    print("| GPU kernels by name | calls a step |\n| --- | ---: |")
    for kind, calls in kinds.most_common():
        print(f"| {kind} | {calls:,} |")


def main() -> None:
    if sys.argv[1] == "gpu":
        gpu_kinds()
        return
    use_autocast = sys.argv[1] == "1"
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    model = build_model("gdn", "180m")
    tokens = torch.randint(0, model.config.vocab_size, (1, 2049))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_autocast):
            loss = model(tokens[:, :-1], labels=tokens[:, 1:]).loss
        loss.backward()

    step()  # warm-up (one-time work off the count)
    model.zero_grad(set_to_none=True)
    with profile() as prof:
        step()
    if sys.argv[2:] == ["ops"]:
        print("| aten op (CPU) | kernels a step |\n| --- | ---: |")
        for name, calls in Counter(e.name for e in prof.events() if is_kernel(e)).most_common(12):
            print(f"| `{name}` | {calls:,} |")
        return
    kernels = Counter("matmul" if e.name.removeprefix("aten::") in LIBRARY else "other"
                      for e in prof.events() if is_kernel(e))  # fmt: skip
    commit = subprocess.run(["git", "-C", str(Path(klalm.__file__).parents[2]), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    total = sum(kernels.values())
    print(
        f"| {commit} | {'bf16' if use_autocast else 'off'} | {kernels['matmul']:,} | {kernels['other']:,} | "
        f"{total:,} | {total / model.config.n_layers:.0f} |"
    )


if __name__ == "__main__":
    main()
