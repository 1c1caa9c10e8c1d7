"""Compile time of one gdn_45m training step (forward + backward, T 2048, batch 1) on the CPU, by torch.compile
backend, with the GDN torch path's state scan as in the tree, or with its levels not checkpointed ("plain":
`klalm.ops.gdn.checkpoint` replaced by a plain call). Each setting in a fresh process with an empty inductor cache
(TORCHINDUCTOR_CACHE_DIR), so every row compiles cold:

    .venv/bin/python results/cpu_2026-12-04e/gdn_compile_time.py            # the table
    .venv/bin/python results/cpu_2026-12-04e/gdn_compile_time.py aot_eager ckpt   # one row
"""

import os
import subprocess
import sys
import tempfile
import time

import torch

import klalm.ops.gdn as gdn_ops
from klalm.models import build_model, prepare_backends


def compile_seconds(backend: str, variant: str, arch: str = "gdn") -> tuple[float, float]:
    if variant == "plain":
        gdn_ops.checkpoint = lambda fn, *args, **_: fn(*args)
    torch.manual_seed(0)
    model = build_model(arch, preset="45m", vocab_size=256).train()
    prepare_backends(model, "cpu")
    ids = torch.randint(0, 256, (1, 2048))
    step = torch.compile(model, backend=backend, fullgraph=True)
    times = []
    for _ in range(2):  # the first call compiles; the second runs what training would run from then on
        start = time.perf_counter()
        step(ids, labels=ids).loss.backward()
        times.append(time.perf_counter() - start)
    return times[0], times[1]


def main() -> None:
    print("| arch | backend | state scan levels | first step s (compile + run) | second step s |")
    print("| --- | --- | --- | ---: | ---: |")
    for arch, backend, variant in [("gdn", "aot_eager", "ckpt"), ("gdn", "aot_eager", "plain"),
                                   ("gdn", "inductor", "ckpt"), ("gdn", "inductor", "plain"),
                                   ("gpt", "inductor", "ckpt")]:  # fmt: skip
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            out = subprocess.run([sys.executable, __file__, backend, variant, arch], capture_output=True, text=True,
                                 env=env)  # fmt: skip
        row = out.stdout.strip() if out.returncode == 0 else f"failed: {out.stderr.strip().splitlines()[-1]}"
        levels = "—" if arch != "gdn" else ("checkpointed" if variant == "ckpt" else "saved")
        print(f"| {arch}_45m | {backend} | {levels} | {row} |", flush=True)
    threads, version = torch.get_num_threads(), torch.__version__
    print(f"\nCold inductor cache each row. CPU, {threads} threads, torch {version}, T 2048, batch 1, vocab 256")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        first, second = compile_seconds(*sys.argv[1:])
        print(f"{first:.1f} | {second:.2f}")
    else:
        main()
