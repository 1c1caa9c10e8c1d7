"""Which kernels of the synthetic trainer's compiled step add with atomics, with and without deterministic mode.

The grid's captured GPU step does not repeat bit for bit (results/gpu_2026-12-04g, MQAR block 19). An atomic add of
floats sums in whatever order the threads arrive, so a step that holds one is not reproducible. This compiles one
MQAR training step (`klalm.tasks.train.train_step`: forward, loss, backward through torch.compile with inductor, as
the grid's `--compile-backend inductor` does) on the CPU, where inductor's scheduler and lowerings are the ones the
GPU gets (the code it emits is C++ instead of Triton), and counts in the generated code the atomic adds and the
`index_put` calls it left to ATen, once as the grid ran and once under `--deterministic`
(`klalm.tasks.train.deterministic_algorithms`). For each atomic add it prints the buffer it writes to, found in the
code around it.

    OMP_NUM_THREADS=2 .venv/bin/python results/cpu_2026-12-04h/inductor_atomics.py \
      > results/cpu_2026-12-04h/inductor_atomics.md
"""

from __future__ import annotations

import re
import subprocess
import sys

import torch
from torch._inductor.utils import run_and_get_code

from klalm.tasks.base import materialize
from klalm.tasks.cells import TrainSettings, Unit
from klalm.tasks.registry import make_task
from klalm.tasks.train import deterministic_algorithms, train_step
from klalm.tasks.units import build_member

# a small (64, 4) cell: the step's ops are the grid's
TASK = {"name": "mqar", "length": 64, "num_pairs": 4, "vocab": 512}
PLAIN = {"mixer_options": {"kla": {"block": "plain"}}}


def count(arch: str, deterministic: bool) -> dict:
    train = TrainSettings(steps=4, batch_size=8, lr=1e-3, warmup=0.1, eval_batch_size=16)
    unit = Unit("mqar", TASK, arch, 2, 64, PLAIN if arch == "kla" else {}, train, [0], 16, 64, None, 20, None)
    split = materialize(make_task(**TASK), 64, 0, "train")
    with deterministic_algorithms(deterministic):
        member = build_member(unit, 0, torch.device("cpu"), split, compile_backend="inductor")
        _, codes = run_and_get_code(train_step, member)
    text = "\n".join(codes)
    # the kernel each atomic add stands in: the last kernel name defined before it (inductor names a fused kernel
    # after the ops it fuses)
    kernels = [(m.start(), m.group(1)) for m in re.finditer(r"^(\w+) = async_compile\.\w+\(", text, re.M)]
    targets = sorted({max((k for k in kernels if k[0] < a.start()), default=(0, "?"))[1]
                      for a in re.finditer(r"\batomic_add", text)})  # fmt: skip
    return {"atomic": len(re.findall(r"\batomic_add", text)), "targets": targets,
            "index_put": len(re.findall(r"aten\.index_put", text)),
            "embedding_backward": "embedding_dense_backward" in text}  # fmt: skip


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    title = "Atomic adds in the compiled synthetic training step"
    print(f"# {title} (torch {torch.__version__}, CPU inductor, {commit})\n")
    print(f"MQAR cell {TASK}, 2 blocks, d_model 64; one `train_step` compiled with inductor.\n")
    print("| arch | mode | atomic adds in generated code | kernels that hold them | aten.index_put calls |")
    print("| --- | --- | ---: | --- | ---: |")
    for arch in sys.argv[1:] or ["gpt", "kla"]:
        for deterministic in (False, True):
            c = count(arch, deterministic)
            mode = "--deterministic" if deterministic else "default (as the grid ran)"
            print(f"| {arch} | {mode} | {c['atomic']} | {', '.join(c['targets']) or '—'} | {c['index_put']} |")


if __name__ == "__main__":
    main()
