"""train.compile=true (the whole model as one graph) against train.compile=blocks (each backbone block compiled on
its own, identical blocks sharing one graph) on the CPU: the cold compile time of the first training step and the
time of the next two, for 45M models at T 2048, batch 1, compiled the way LMModule.configure_model compiles them.
Each row in a fresh process with an empty inductor cache, denormals flushed:

    .venv/bin/python results/cpu_2026-12-04f/compile_blocks.py             # the table
    .venv/bin/python results/cpu_2026-12-04f/compile_blocks.py gdn blocks  # one row
"""

import os
import subprocess
import sys
import tempfile
import time

import torch

# kla is left out: on the CPU its scan is the torch path, whose whole-model compile ran over 9 minutes here without
# finishing, while a GPU compiles the Triton scan as one opaque custom op, so the CPU would not say what the GPU does
ARCHS = ("gdn", "gpt")
MODES = {"model": True, "blocks": "blocks"}  # the row's name -> train.compile


def step_seconds(arch: str, mode: str) -> list[float]:
    from klalm.models import build_model
    from klalm.train.budget import derive_budget
    from klalm.train.module import LMModule

    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    budget = derive_budget(max_tokens=4096, global_batch_tokens=2048, micro_batch_size=1, seq_len=2048, world_size=1)
    module = LMModule(build_model(arch, preset="45m", vocab_size=256), None, None, budget, compile=MODES[mode])
    module.configure_model()
    ids = torch.randint(0, 256, (1, 2048))
    times = []
    for _ in range(3):  # the first call compiles; the other two run what training would run from then on
        start = time.perf_counter()
        module.model(ids, labels=ids).loss.backward()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    print("| model | train.compile | first step s (compile + run) | second, third step s |")
    print("| --- | --- | ---: | ---: |")
    for arch in ARCHS:
        for mode in MODES:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                out = subprocess.run([sys.executable, __file__, arch, mode], capture_output=True, text=True, env=env)
            row = out.stdout.strip() if out.returncode == 0 else f"failed: {out.stderr.strip().splitlines()[-1]}"
            print(f"| {arch}_45m | {MODES[mode]} | {row} |".replace("| True |", "| true |"), flush=True)
    threads, version = torch.get_num_threads(), torch.__version__
    print(f"\nCold inductor cache each row. CPU, {threads} threads, torch {version}, T 2048, batch 1, vocab 256")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        first, *rest = step_seconds(*sys.argv[1:])
        print(f"{first:.1f} | {', '.join(f'{t:.2f}' for t in rest)}")
    else:
        main()
