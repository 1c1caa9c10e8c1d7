"""Per-step numbers of compiled selective-scan backward kernels, and a straight-line fit of the measured backward
times to the one-warp model's cycles (loop_table.py, results/cpu_2026-12-01g/ss). A model, not a measurement.

    .venv-triton36/bin/python results/cpu_2026-12-01h/ss_bwd/step_model.py OUTDIR/TAG_bwd_fp32 ...
    .venv-triton36/bin/python results/cpu_2026-12-01h/ss_bwd/step_model.py --fit OUTDIR/TAG_bwd_fp32=2.953 ...

Per stem (a compile_ss.py / compile_bwd.py output; `STEM:U` for a loop unrolled U times, default 4): registers, warps
per SM, and per time step L (the one-warp cycles of the recompute plus the reverse loop, divided by the unroll) and
I (their issue cycles, the same way), and `pred ms`: INTERCEPT + SLOPE·L, the fit below. --fit: least squares of the
given backward times (ms, B16 L2048 M1024 N16 on the H200: f+b less fwd) on L, on I, and on both.

The fit (README.md here): the eight backward kernels timed on the H200 so far (main, the row-bases patch and its
plain-store variant, results/gpu_2026-12-01g; the committed one, results/gpu_2026-12-01h; each in fp32 and in bf16
rows) against L: ms = 1.889 + 0.001517·L, residuals ≤ 0.081 ms (rms 0.048); I adds nothing (the fit on I alone: rms
0.29 ms). All eight had 11-14 warps per SM (two waves of the 2,048 programs); beyond that it is extrapolation.
"""

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01g" / "ss"))
import loop_table as lt  # noqa: E402

INTERCEPT, SLOPE = 1.889, 0.001517


def per_step(arg: str) -> tuple[str, int, int, float, float]:
    stem, _, unroll = arg.partition(":")
    regs = lt.registers(stem)
    warps = 65536 // (math.ceil(regs * 32 / 256) * 256)
    cycles = issue = 0
    for _, body in lt.main_loops(stem):
        c, _, i = lt.simulate(body)
        cycles, issue = cycles + c, issue + i
    u = int(unroll or 4)
    return Path(stem).name, regs, warps, cycles / u, issue / u


def main() -> None:
    fit = sys.argv[1] == "--fit"
    args = sys.argv[1 + fit :]
    if not fit:
        print("| kernel | registers (warps/SM) | L / step | I / step | pred ms |\n|---|---|---:|---:|---:|")
        for arg in args:
            name, regs, warps, cycles, issue = per_step(arg)
            print(f"| {name} | {regs} ({warps}) | {cycles:.0f} | {issue:.0f} | {INTERCEPT + SLOPE * cycles:.3f} |")
        return
    rows = [(per_step(a.rsplit("=", 1)[0]), float(a.rsplit("=", 1)[1])) for a in args]
    ms = torch.tensor([m for _, m in rows], dtype=torch.float64)
    for name, cols in (("L", (3,)), ("I", (4,)), ("L, I", (3, 4))):
        x = torch.tensor([[1.0] + [r[c] for c in cols] for r, _ in rows], dtype=torch.float64)
        coef = torch.linalg.lstsq(x, ms[:, None]).solution[:, 0]
        resid = ms - x @ coef
        print(f"on {name}: coefficients {[round(v, 6) for v in coef.tolist()]}, rms residual "
              f"{resid.square().mean().sqrt():.3f} ms, max {resid.abs().max():.3f}")  # fmt: skip
        for (r, m), e in zip(rows, resid.tolist()):
            print(f"   {r[0]}: L {r[3]:.0f}, I {r[4]:.0f}, measured {m:.3f}, residual {e:+.3f}")


if __name__ == "__main__":
    main()
