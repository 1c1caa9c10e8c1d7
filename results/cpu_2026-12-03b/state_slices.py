"""GPU: is the KLA scan faster as several scans over slices of its state? Each (m, s) of the filter is its own
recurrence (docs/kla.md): only the readout y = Σ_s q_s·μ_{m,s} (and y_var) and the gradients of v and Λ sum over
s; the gradients of k and q are per s. So a scan with S key dimensions equals the sum of S / W scans over
k[..., i:i+W], q[..., i:i+W], a[:, i:i+W], p[:, i:i+W], each on the kernels (and launch config) of width W, at the
price of writing y and the v, Λ gradients S / W times. Two cases:

- MQAR's capacity-unit layer (B256 L2048 M256, S 64) as four S-16 scans: the S-16 backward runs at 3.6 ps per
  (b, t, m, s) at kla_45m's shape against 5.0 at S 64 (kernels/NOTES.md, "Eighteenth session"), with a quarter of
  its dk, dq partial rows per element.
- kla_45m's layer (B16 L2048 M1024, S 16) as two S-8 scans: half the state per program, so fewer registers and
  more warps to hide the backward's dependency stalls (255 registers and 1.3 warps per scheduler at S 16).

For each, the step (forward + backward of y, with the layer's bf16 v, k, q) is timed whole, sliced and whole again
(the drift), after a check in float32 of how far the slices' y and gradients are from the whole scan's (with bf16
rows each slice's y comes back rounded to bf16 before the sum: a real sliced path would need float32 partial
outputs). From the repository root, on the GPU (about a minute):

    source scripts/device_setup.sh && python3 results/cpu_2026-12-03b/state_slices.py

Under TRITON_INTERPRET=1 (CPU) it runs at tiny shapes, to check the script and the identity, not the speed.
"""

import torch

from klalm.kernels.bench_scan import LAYER_NARROW, _narrow, kla_inputs, timed_ms
from klalm.kernels.common import interpreting
from klalm.kernels.mobius_scan import kla_scan_triton

CASES = [  # (name, shape, slice width W)
    ("MQAR capacity unit, S 64 as 4 x S 16", dict(batch=256, length=2048, channels=256, state=64), 16),
    ("kla_45m, S 16 as 2 x S 8", dict(batch=16, length=2048, channels=1024, state=16), 8),
]
if interpreting():
    CASES = [(name, dict(shape, batch=1, length=40, channels=8), width) for name, shape, width in CASES]
NAMES = ["y", "dv", "dΛ", "dk", "dq", "da", "dp"]


def whole(v, lam, k, q, a, p, width=None):
    return kla_scan_triton(v, lam, k, q, a, p, variance=False)[0]


def sliced(v, lam, k, q, a, p, width=16):
    parts = [kla_scan_triton(v, lam, k[..., i : i + width], q[..., i : i + width], a[:, i : i + width],
                             p[:, i : i + width], variance=False)[0] for i in range(0, k.shape[-1], width)]  # fmt: skip
    return torch.stack(parts).sum(0)


def step(scan, leaves, width):
    def run():
        scan(*leaves, width=width).sum().backward()
        for x in leaves:
            x.grad = None

    return run


def identity(f32: list[torch.Tensor], width: int) -> str:
    """max |sliced - whole| / max |whole| of y and every gradient, float32 rows."""
    leaves = [x.detach().clone().requires_grad_() for x in f32]
    results = []
    for scan in (whole, sliced):
        y = scan(*leaves, width=width)
        y.square().sum().backward()  # gradients that depend on y
        results.append([y.detach()] + [x.grad.detach() for x in leaves])
        for x in leaves:
            x.grad = None
    diffs = [((s - w).abs().max() / w.abs().max().clamp_min(1e-30)).item() for w, s in zip(*results, strict=True)]
    return ", ".join(f"{n} {d:.1e}" for n, d in zip(NAMES, diffs, strict=True))


def main() -> None:
    for name, shape, width in CASES:
        f32 = kla_inputs(**shape)
        print(f"\n{name}: B{shape['batch']} L{shape['length']} M{shape['channels']} S{shape['state']}")
        print(f"float32 rows, max |sliced - whole| / max |whole|: {identity(f32, width)}")
        leaves = [x.detach().clone().requires_grad_() for x in _narrow(f32, torch.bfloat16, LAYER_NARROW)]
        print("| scan (bf16 v, k, q) | f+b(y) ms |")
        print("| --- | ---: |", flush=True)
        for label, scan in (("whole", whole), (f"{shape['state'] // width} slices of {width}", sliced),
                            ("whole, again", whole)):  # fmt: skip
            print(f"| {label} | {timed_ms(step(scan, leaves, width))} |", flush=True)
        del f32, leaves
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
