"""GPU: is the KLA scan at d_state 64 faster as four d_state-16 scans over slices of the state? Each (m, s) of the
filter is its own recurrence (docs/kla.md): only the readout y = Σ_s q_s·μ_{m,s} (and y_var) and the gradients of
v and Λ sum over s, and the gradients of k and q are per s. So the scan at S 64 equals the sum of four scans over
k[..., i:i+16], q[..., i:i+16], a[:, i:i+16], p[:, i:i+16] (i = 0, 16, 32, 48), each on the S-16 kernels, whose
backward runs at 3.6 ps per (b, t, m, s) at kla_45m's shape against 5.0 at S 64 (kernels/NOTES.md, "Eighteenth
session"), at the price of writing y and the v, Λ gradients four times. Times the training step (forward +
backward of y, bf16 v, k, q) at MQAR's capacity-unit layer (B256 L2048 M256 S64) both ways, the whole scan twice
(first and last: the drift), and prints how far the four slices' y and gradients are from the whole scan's
with float32 rows (with bf16 rows each slice's y is rounded to bf16 before the sum). From
the repository root, on the GPU (about a minute):

    source scripts/device_setup.sh && python3 results/cpu_2026-12-03b/s64_slices.py

Under TRITON_INTERPRET=1 (CPU) it runs at a tiny shape, to check the script and the identity, not the speed.
"""

import torch

from klalm.kernels.bench_scan import LAYER_NARROW, _narrow, kla_inputs, timed_ms
from klalm.kernels.common import interpreting
from klalm.kernels.mobius_scan import kla_scan_triton

SHAPE = dict(batch=1, length=40, channels=8, state=64) if interpreting() else dict(batch=256, length=2048,
                                                                                   channels=256, state=64)  # fmt: skip
SLICE = 16


def whole(v, lam, k, q, a, p):
    return kla_scan_triton(v, lam, k, q, a, p, variance=False)[0]


def sliced(v, lam, k, q, a, p):
    parts = [kla_scan_triton(v, lam, k[..., i : i + SLICE], q[..., i : i + SLICE], a[:, i : i + SLICE],
                             p[:, i : i + SLICE], variance=False)[0] for i in range(0, k.shape[-1], SLICE)]  # fmt: skip
    return torch.stack(parts).sum(0)


def step(scan, leaves):
    def run():
        scan(*leaves).sum().backward()
        for x in leaves:
            x.grad = None

    return run


def main() -> None:
    f32 = kla_inputs(**SHAPE)
    leaves = [x.detach().clone().requires_grad_() for x in f32]  # the identity, checked in float32
    results = {}
    for name, scan in (("whole", whole), ("four slices", sliced)):
        y = scan(*leaves)
        y.float().square().sum().backward()  # gradients that depend on y
        results[name] = [y.detach().float()] + [x.grad.detach().float() for x in leaves]
        for x in leaves:
            x.grad = None
    names = ["y", "dv", "dΛ", "dk", "dq", "da", "dp"]
    diffs = [((s - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()
             for w, s in zip(results["whole"], results["four slices"], strict=True)]  # fmt: skip
    print("fp32 rows, max |four slices - whole| / max |whole|: "
          + ", ".join(f"{n} {d:.1e}" for n, d in zip(names, diffs, strict=True)))  # fmt: skip
    # timed with the layer's bf16 v, k, q; each slice's y (and dv) then comes back in bf16 before the sum, so a
    # real sliced path would need float32 partial outputs (not measured here: the kernels' time is the question)
    leaves = [x.detach().clone().requires_grad_() for x in _narrow(f32, torch.bfloat16, LAYER_NARROW)]
    print("shape B{batch} L{length} M{channels} S{state}, bf16 v, k, q".format(**SHAPE))
    print("| scan | f+b(y) ms |")
    print("| --- | ---: |", flush=True)
    for name, scan in (("whole (S 64 config)", whole), ("four slices (S 16 config)", sliced), ("whole, again", whole)):
        print(f"| {name} | {timed_ms(step(scan, leaves))} |", flush=True)


if __name__ == "__main__":
    main()
