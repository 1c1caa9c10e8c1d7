"""results/cpu_2026-12-04's trace-time measurement, repeated after the change: the time torch.compile takes to trace
klalm's torch GDN path (dynamo + AOTAutograd, backend aot_eager, so no code generation) for one call at 8, 16 and 32
chunks of 64 tokens, on the CPU. The Python loop that carries the [K, V] state over chunks (`_pass_state` in
src/klalm/ops/gdn.py) is now `torch.compiler.disable`d: a graph break, run eagerly, no longer unrolled by dynamo.

    .venv/bin/python results/cpu_2026-12-04b/gdn_compile_trace.py | tee results/cpu_2026-12-04b/gdn_compile_trace.md
"""

import time

import torch
import torch._dynamo

from klalm.ops.gdn import gated_delta_rule_torch


def inputs(length: int, batch: int = 1, heads: int = 2, dk: int = 16, dv: int = 16) -> list[torch.Tensor]:
    unit = lambda: torch.nn.functional.normalize(torch.randn(batch, length, heads, dk), dim=-1)  # noqa: E731
    raw = [unit(), unit(), torch.randn(batch, length, heads, dv), -torch.rand(batch, length, heads),
           torch.rand(batch, length, heads)]  # fmt: skip
    return [t.requires_grad_() for t in raw]


def main() -> None:
    print("| T | chunks of 64 | first call: trace + AOT, forward + backward, s | second call, s |")
    print("| ---: | ---: | ---: | ---: |")
    for length in (512, 1024, 2048):
        torch._dynamo.reset()
        x = inputs(length)
        fn = torch.compile(lambda *a: gated_delta_rule_torch(*a, None, 0.25)[0], backend="aot_eager")
        times = []
        for _ in range(2):
            start = time.perf_counter()
            fn(*x).sum().backward()
            times.append(time.perf_counter() - start)
        print(f"| {length} | {length // 64} | {times[0]:.1f} | {times[1]:.2f} |")
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} CPU threads")


if __name__ == "__main__":
    main()
