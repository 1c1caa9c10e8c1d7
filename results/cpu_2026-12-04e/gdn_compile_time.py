"""Compile time of one gdn_45m training step (forward + backward, T 2048, batch 1) on the CPU through torch.compile,
and the compiled step's time, for three ways of passing the GDN state between chunks (the variants of
`gdn_state_pass_time.py`: loop, scan, groups), gpt_45m for scale. Each row in a fresh process on a copy of src/ with
that variant's gdn.py, with an empty inductor cache (TORCHINDUCTOR_CACHE_DIR), so every row compiles cold, and
denormals flushed (see gdn_state_pass_time.py):

    .venv/bin/python results/cpu_2026-12-04e/gdn_compile_time.py                  # the table
    .venv/bin/python results/cpu_2026-12-04e/gdn_compile_time.py inductor gdn     # one row, on whatever src/ imports
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gdn_state_pass_time import VARIANTS, variant_source  # noqa: E402

SRC = Path(__file__).parents[2] / "src"


def compile_seconds(backend: str, arch: str) -> tuple[float, float]:
    from klalm.models import build_model, prepare_backends

    torch.set_flush_denormal(True)
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


def run_row(backend: str, arch: str, variant: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("__pycache__"))
        (src / "klalm" / "ops" / "gdn.py").write_text(variant_source(variant))
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "cache"), "PYTHONPATH": str(src)}
        out = subprocess.run([sys.executable, __file__, backend, arch], capture_output=True, text=True, env=env)
    return out.stdout.strip() if out.returncode == 0 else f"failed: {out.stderr.strip().splitlines()[-1]}"


def main() -> None:
    print("| arch | state pass | backend | first step s (compile + run) | second step s |")
    print("| --- | --- | --- | ---: | ---: |")
    rows = [("gdn", name, backend) for name in VARIANTS for backend in ("aot_eager", "inductor")]
    for arch, name, backend in [*rows, ("gpt", "—", "inductor")]:
        row = run_row(backend, arch, name if arch == "gdn" else "groups")
        print(f"| {arch}_45m | {name} | {backend} | {row} |", flush=True)
    threads, version = torch.get_num_threads(), torch.__version__
    print(f"\nCold inductor cache each row. CPU, {threads} threads, torch {version}, T 2048, batch 1, vocab 256")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        first, second = compile_seconds(*sys.argv[1:])
        print(f"{first:.1f} | {second:.2f}")
    else:
        main()
