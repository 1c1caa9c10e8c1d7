"""How many compiled graphs one forward of each 45M LM runs under torch.compile, and how many graph breaks dynamo
counted, on the CPU: each model compiled the way LMModule compiles it in the tree it runs on (`prepare_backends`
first where the tree has it), with a backend that only counts, so no code is generated. Run on a tree and on the
tree with this folder's patch reversed:

    .venv/bin/python results/cpu_2026-12-04d/graphs_per_forward.py
"""

import subprocess
import sys

import torch
import torch._dynamo
from torch._dynamo.utils import counters

import klalm.models
from klalm.models import ARCH_LAYOUTS, build_model


def graphs_per_forward(arch: str) -> tuple[int, int, int]:
    torch._dynamo.reset()
    counters.clear()
    model = build_model(arch, preset="45m", vocab_size=256).train()
    prepare = getattr(klalm.models, "prepare_backends", None)
    if prepare is not None:
        prepare(model, "cpu")
    ids = torch.randint(0, 256, (1, 130), generator=torch.Generator().manual_seed(0))
    runs, compiled = [0], [0]

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        compiled[0] += 1

        def run(*args: object) -> object:
            runs[0] += 1
            return gm.forward(*args)

        return run

    step = torch.compile(model, backend=backend)
    for _ in range(3):  # the third call runs what training would run from then on
        runs[0] = 0
        step(ids, labels=ids)
    return runs[0], compiled[0], sum(counters["graph_break"].values())


def main() -> None:
    """Each model in a fresh process, as a training run starts: no backend chosen, no RoPE table built yet."""
    print("| model | graphs run by one forward (third call) | graphs compiled in three calls | graph breaks counted |")
    print("| --- | ---: | ---: | ---: |")
    for arch in sorted(ARCH_LAYOUTS):
        row = subprocess.run([sys.executable, __file__, arch], capture_output=True, text=True, check=True).stdout
        print(f"| {arch}_45m | {row.strip()} |")
    print(f"\nT 130, batch 1, CPU (backends 'auto': the torch paths); torch {torch.__version__}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(" | ".join(map(str, graphs_per_forward(sys.argv[1]))))
    else:
        main()
