"""Per-step numbers of compiled KLA backward kernels (`_kla_bwd_kernel`) and fits of the measured backward times to
them. A model, not a measurement.

    .venv-triton36/bin/python results/cpu_2026-12-01h/kla_bwd/step_model.py STEM[:UNROLL] ...      # per-step table
    .venv-triton36/bin/python results/cpu_2026-12-01h/kla_bwd/step_model.py --fit                  # the calibration
    .venv-triton36/bin/python results/cpu_2026-12-01h/kla_bwd/step_model.py --predict TAG ...      # predictions

Per stem (compile_cases.py output): registers, warps per SM, and per time step (the recompute plus the reverse loop,
divided by the unroll, default 2): L, the one-warp in-order cycles of ../../cpu_2026-12-01g/ss/loop_table.py; I, its
issue cycles (stall counts); N, SASS instructions. --fit reads the measured times in MEASURED below (f+b(y) ms and
fwd ms without y_var, B16 L2048 M1024 S16, block_m 32, bwd_block_m 16, results/gpu_2026-12-01g and -01h) and the
stems in ASM (compiled here, same names): the folder $KB_ASM, /tmp/kb_asm unless set.
"""

import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01g" / "ss"))
import loop_table as lt  # noqa: E402

ASM = Path(os.environ.get("KB_ASM", "/tmp/kb_asm"))  # compile_cases.py OUTDIR
ROWS = ("fp32", "fp32lv", "bf16", "bf16lv", "fp16")
# tree -> (f+b(y) ms per row, fwd ms no y_var per row), rows in ROWS order; the forward group ("G": f8782e5's forward,
# "H": the joint-store forward of the merged trees) decides which forward ran inside f+b
MEASURED = {
    # results/gpu_2026-12-01g (f8782e5 and two backward patches of results/cpu_2026-12-01f)
    "kbG0": ("G", (3.462, 5.270, 3.519, 5.696, 3.506), (0.642, 1.269, 0.618, 1.405, 0.666)),
    "kbG1": ("G", (3.424, 5.151, 3.215, 5.383, 3.218), (0.642, 1.270, 0.619, 1.409, 0.666)),
    "kbG2": ("G", (3.281, 4.970, 3.172, 5.205, 3.170), (0.642, 1.271, 0.618, 1.409, 0.667)),
    # results/gpu_2026-12-01h (ebd48a9 and the two patches of results/cpu_2026-12-01g/kla_bwd; even_rows = HEAD)
    "kbH0": ("H", (3.232, 5.053, 3.094, 4.917, 3.086), (0.525, 1.004, 0.543, 1.098, 0.551)),
    "kbH1": ("H", (3.216, 4.956, 3.075, 4.890, 3.074), (0.526, 1.001, 0.544, 1.100, 0.552)),
    "kbH2": ("H", (3.226, 4.824, 3.073, 4.830, 3.055), (0.526, 1.001, 0.544, 1.099, 0.552)),
}


def per_step(arg: str):
    stem, _, unroll = arg.partition(":")
    regs = lt.registers(stem)
    warps = 65536 // (math.ceil(regs * 32 / 256) * 256)
    cycles = issue = n = 0
    for _, body in lt.main_loops(stem):
        c, _, i = lt.simulate(body)
        cycles, issue = cycles + c, issue + i
        n += sum(1 for x in body if not x.get("label"))
    u = int(unroll or 2)
    return Path(stem).name, regs, warps, cycles / u, issue / u, n / u


def lstsq(x, y):
    coef = torch.linalg.lstsq(x, y[:, None]).solution[:, 0]
    return coef, y - x @ coef


def fit() -> None:
    pts = []  # (tree, row, group, f+b, bwd, L, I, N)
    for tree, (group, fb, fw) in MEASURED.items():
        for j, row in enumerate(ROWS):
            _, regs, warps, L, n_issue, N = per_step(str(ASM / f"{tree}_bwd_{row}"))
            pts.append((tree, row, group, fb[j], fb[j] - fw[j], L, n_issue, N))
    y_bwd = torch.tensor([p[4] for p in pts], dtype=torch.float64)
    y_fb = torch.tensor([p[3] for p in pts], dtype=torch.float64)
    keys = sorted({(p[2], p[1]) for p in pts})
    for feat, col in (("L", 5), ("I", 6), ("N", 7)):
        xs = torch.tensor([p[col] for p in pts], dtype=torch.float64)
        # (a) one line through bwd = f+b - fwd (no y_var), all 30 points
        coef, res = lstsq(torch.stack([torch.ones_like(xs), xs], 1), y_bwd)
        print(
            f"(a) bwd = a + b*{feat}: a {coef[0]:.3f}, b {coef[1]:.6f}, rms {res.square().mean().sqrt():.3f}, "
            f"max {res.abs().max():.3f}"
        )
        # (b) f+b = c(group, row) + b*feat: the slope from the backward-only changes within each group and row
        x = torch.zeros(len(pts), len(keys) + 1, dtype=torch.float64)
        for i, p in enumerate(pts):
            x[i, keys.index((p[2], p[1]))] = 1.0
            x[i, -1] = p[col]
        coefb, resb = lstsq(x, y_fb)
        dof = len(pts) - len(keys) - 1
        print(
            f"(b) f+b = c(group,row) + b*{feat}: b {coefb[-1]:.6f} ms per cycle/step,"
            f" rms {resb.square().mean().sqrt():.3f}"
            f" (dof-corrected {math.sqrt(resb.square().sum() / dof):.3f}), max {resb.abs().max():.3f}"
        )
        if feat == "N":
            coefb_n = coefb
        if feat == "N":  # the model used: the residual columns of the table below
            best = (coef, res, coefb, resb)
    # (c) f+b = c(group, row) + b1*N + b2*L: does the one-warp latency add anything to the instruction count?
    x = torch.zeros(len(pts), len(keys) + 2, dtype=torch.float64)
    for i, p in enumerate(pts):
        x[i, keys.index((p[2], p[1]))] = 1.0
        x[i, -2], x[i, -1] = p[7], p[5]
    coefc, resc = lstsq(x, y_fb)
    dof = len(pts) - len(keys) - 2
    print(
        f"(c) f+b = c(group,row) + b1*N + b2*L: b1 {coefc[-2]:.6f}, b2 {coefc[-1]:.6f}, rms "
        f"{resc.square().mean().sqrt():.3f} (dof-corrected {math.sqrt(resc.square().sum() / dof):.3f})"
    )
    # leave-one-tree-out check of (b) on N: predict each tree's five rows from the other five trees
    xs = torch.tensor([p[7] for p in pts], dtype=torch.float64)
    errs = []
    for tree in MEASURED:
        keep = [i for i, p in enumerate(pts) if p[0] != tree]
        x = torch.zeros(len(pts), len(keys) + 1, dtype=torch.float64)
        for i, p in enumerate(pts):
            x[i, keys.index((p[2], p[1]))] = 1.0
            x[i, -1] = p[7]
        coef_l, _ = lstsq(x[keep], y_fb[keep])
        out = [i for i in range(len(pts)) if i not in keep]
        errs += (y_fb[out] - x[out] @ coef_l).tolist()
    e = torch.tensor(errs)
    print(f"(b) on N, leave one tree out: rms {e.square().mean().sqrt():.3f} ms, max {e.abs().max():.3f}")
    print(
        "intercepts c(group,row) of (b) on N:", {f"{k[0]}/{k[1]}": round(v, 3) for k, v in zip(keys, coefb_n.tolist())}
    )
    coef, res, coefb, resb = best
    print(
        "\n| tree | row | f+b ms | bwd ms | L/step | I/step | N/step | (a) on N resid | (b) on N resid |"
        "\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for p, r, rb in zip(pts, res.tolist(), resb.tolist()):
        print(
            f"| {p[0]} | {p[1]} | {p[3]:.3f} | {p[4]:.3f} | {p[5]:.0f} | {p[6]:.0f} | {p[7]:.0f}"
            f" | {r:+.3f} | {rb:+.3f} |"
        )


def slope_n():
    """(b) on N: the slope (ms per instruction per step) and its standard error."""
    pts = []
    for tree, (group, fb, _fw) in MEASURED.items():
        for j, row in enumerate(ROWS):
            pts.append((group, row, fb[j], per_step(str(ASM / f"{tree}_bwd_{row}"))[5]))
    keys = sorted({(p[0], p[1]) for p in pts})
    x = torch.zeros(len(pts), len(keys) + 1, dtype=torch.float64)
    for i, p in enumerate(pts):
        x[i, keys.index((p[0], p[1]))] = 1.0
        x[i, -1] = p[3]
    y = torch.tensor([p[2] for p in pts], dtype=torch.float64)
    coef, res = lstsq(x, y)
    s2 = res.square().sum() / (len(pts) - x.shape[1])
    cov = s2 * torch.linalg.inv(x.T @ x)
    return coef[-1].item(), cov[-1, -1].sqrt().item(), math.sqrt(s2.item())


def predict(tags) -> None:
    """Predicted f+b(y) and bwd ms of compiled trees TAG (ASM/TAG_bwd_ROW) from HEAD's measured rows (kbH2, the
    timed even_rows = HEAD) and the (b) slope on N: pred = measured(HEAD) + b·(N - N_HEAD)."""
    b, se, sd = slope_n()
    _, fb, fw = MEASURED["kbH2"]
    print(f"slope b = {b:.5f} ± {se:.5f} ms per instruction/step (fit residual sd {sd:.3f} ms)\n")
    print("| tree | row | registers (warps/SM) | N/step | ΔN | pred f+b ms (HEAD meas.) | pred bwd ms | Δ ms ± |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for tag in tags:
        for j, row in enumerate(ROWS):
            n0 = per_step(str(ASM / f"kbH2_bwd_{row}"))[5]
            name, regs, warps, L, n_issue, n = per_step(str(ASM / f"{tag}_bwd_{row}"))
            d = b * (n - n0)
            err = math.hypot(se * abs(n - n0), sd * math.sqrt(2))
            print(
                f"| {tag} | {row} | {regs} ({warps}) | {n:.1f} | {n - n0:+.1f} | {fb[j] + d:.3f} ({fb[j]:.3f}) | "
                f"{fb[j] - fw[j] + d:.3f} | {d:+.3f} ± {err:.3f} |"
            )


def main() -> None:
    if sys.argv[1] == "--fit":
        return fit()
    if sys.argv[1] == "--predict":
        return predict(sys.argv[2:])
    print("| kernel | registers (warps/SM) | L / step | I / step | N / step |\n|---|---|---:|---:|---:|")
    for arg in sys.argv[1:]:
        name, regs, warps, L, n_issue, N = per_step(arg)
        print(f"| {name} | {regs} ({warps}) | {L:.0f} | {n_issue:.0f} | {N:.0f} |")


if __name__ == "__main__":
    main()
