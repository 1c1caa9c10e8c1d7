"""Benchmark the KLA scan backends on the CPU (or one GPU) and print a Markdown table.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_scan_cpu.py --batch 4 --length 1024 --channels 256 --state 16

Each backend runs in its own subprocess so that its peak memory is its own: on CPU the column is the
growth of the peak resident set size (ru_maxrss) over the inputs, on CUDA `torch.cuda.max_memory_allocated`
minus the inputs. Times are the minimum over `--repeats` runs after one warm-up (the minimum is the least
disturbed by other processes on a shared machine). "fwd" runs under `torch.no_grad()`; "fwd+bwd" runs the
forward with gradients for every input and the backward of sum(y) + sum(y_var); "fwd+bwd (y) ms" the backward
of sum(y) alone, as in training, where y_var is unused.

With --accuracy it instead prints, for every output and every gradient, max|error| / max|value| of
float32 runs against the float64 reference on the same inputs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from functools import partial

import torch

from klalm.ops import BACKENDS, kla_scan
from klalm.ops.chunked_scan import kla_scan_torch
from klalm.ops.common import KLAState
from klalm.ops.reference import kla_scan_reference

MB = 1024**2


def make_inputs(args: argparse.Namespace) -> list[torch.Tensor]:
    """Seeded inputs in the ranges the KLA layer produces: Λ in [0.1, 1.1], unit-norm k, a near 1, small p."""
    g = torch.Generator().manual_seed(0)
    b, length, m, s = args.batch, args.length, args.channels, args.state
    v = torch.randn(b, length, m, generator=g)
    lambda_v = torch.rand(b, length, m, generator=g) + 0.1
    k = torch.nn.functional.normalize(torch.randn(b, length, s, generator=g), dim=-1)
    q = torch.nn.functional.normalize(torch.randn(b, length, s, generator=g), dim=-1)
    a = torch.rand(m, s, generator=g) * 0.1 + 0.9
    p = torch.rand(m, s, generator=g) * 0.01
    return [t.to(args.device) for t in (v, lambda_v, k, q, a, p)]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time_ms(fn, repeats: int, device: str) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _peak_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / MB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def worker(args: argparse.Namespace) -> dict:
    """Time one backend and measure its peak memory above the inputs; returns one table row."""
    inputs = make_inputs(args)
    if args.backend == "torch" and args.chunk:
        scan = lambda *x: kla_scan_torch(*x, chunk_size=args.chunk)  # noqa: E731
    else:
        scan = lambda *x: kla_scan(*x, backend=args.backend)  # noqa: E731

    def forward():
        with torch.no_grad():
            scan(*inputs)

    def forward_backward(use_var: bool):
        leaves = [t.detach().requires_grad_() for t in inputs]
        y, y_var, _ = scan(*leaves)
        (y.sum() + y_var.sum() if use_var else y.sum()).backward()

    base = _peak_mb(args.device)
    fwd_ms = _time_ms(forward, args.repeats, args.device)
    fwd_bwd_ms = _time_ms(partial(forward_backward, True), args.repeats, args.device)
    peak_mb = _peak_mb(args.device) - base
    fwd_bwd_y_ms = _time_ms(partial(forward_backward, False), args.repeats, args.device)
    return {"backend": args.backend, "chunk": args.chunk, "fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms,
            "fwd_bwd_y_ms": fwd_bwd_y_ms, "peak_mb": peak_mb}  # fmt: skip


def _outputs_and_grads(scan, inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """y, y_var, final state and the gradients of a fixed random linear loss w.r.t. all eight inputs."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    y, y_var, state = scan(*leaves[:6], KLAState(leaves[6], leaves[7]))
    outs = {"y": y, "y_var": y_var, "lam": state.lam, "eta": state.eta}
    g = torch.Generator().manual_seed(1)
    loss = sum((torch.randn(o.shape, generator=g, dtype=torch.float64).to(o) * o).sum() for o in outs.values())
    grads = torch.autograd.grad(loss, leaves)
    names = ("v", "lambda_v", "k", "q", "a", "p", "lam0", "eta0")
    return {n: t.detach().double() for n, t in [*outs.items(), *(("d" + n, t) for n, t in zip(names, grads))]}


def accuracy(args: argparse.Namespace, chunks: list[int]) -> None:
    """Print max|error|/max|value| of float32 runs against the float64 reference, output by output."""
    inputs = make_inputs(args)
    b, m, s = args.batch, args.channels, args.state
    inputs += [torch.ones(b, m, s, device=args.device), torch.zeros(b, m, s, device=args.device)]  # fresh state
    truth = _outputs_and_grads(kla_scan_reference, [t.double() for t in inputs])
    runs = {"reference fp32": kla_scan_reference, "torch fp32 (default chunk)": kla_scan_torch}
    runs |= {f"torch fp32 (chunk {c})": partial(kla_scan_torch, chunk_size=c) for c in chunks}
    print(f"| run | {' | '.join(truth)} |\n| --- |{' ---: |' * len(truth)}")
    for label, scan in runs.items():
        got = _outputs_and_grads(scan, [t.float() for t in inputs])
        errs = [((got[n] - truth[n]).abs().max() / truth[n].abs().max()).item() for n in truth]
        print(f"| {label} | {' | '.join(f'{e:.1e}' for e in errs)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--channels", type=int, default=256)
    parser.add_argument("--state", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backends", default="reference,torch", help=f"comma-separated, from {sorted(BACKENDS)}")
    parser.add_argument("--chunks", default="", help="extra torch rows with these chunk sizes, e.g. 32,64")
    parser.add_argument("--accuracy", action="store_true", help="print float32 errors against float64 instead")
    parser.add_argument("--backend", help=argparse.SUPPRESS)  # worker mode
    parser.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.backend:
        print(json.dumps(worker(args)))
        return
    chunks = [int(c) for c in args.chunks.split(",") if c]
    if args.accuracy:
        accuracy(args, chunks)
        return
    runs = [(name, 0) for name in args.backends.split(",")] + [("torch", c) for c in chunks]
    shape = f"--batch {args.batch} --length {args.length} --channels {args.channels} --state {args.state}"
    print(f"B={args.batch} L={args.length} M={args.channels} S={args.state}, {args.device}, "
          f"float32, torch {torch.__version__}, {torch.get_num_threads()} threads\n")  # fmt: skip
    print("| backend | fwd ms | fwd+bwd ms | fwd+bwd (y) ms | peak MB above inputs |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, chunk in runs:
        cmd = [sys.executable, __file__, *shape.split(), "--device", args.device, "--repeats", str(args.repeats)]
        cmd += ["--backend", name, "--chunk", str(chunk)]
        row = json.loads(
            subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        )
        label = name + (f" (chunk {chunk})" if chunk else "")
        cells = f"{row['fwd_ms']:.1f} | {row['fwd_bwd_ms']:.1f} | {row['fwd_bwd_y_ms']:.1f} | {row['peak_mb']:.0f}"
        print(f"| {label} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
