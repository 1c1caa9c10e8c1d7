"""Per-time-step counts of the compiled time loops of compile_split.py's kernels (OUTDIR/TAG_KERNEL_ROW.hex.sass), by
kind, with one warp's cycles per iteration from ../../cpu_2026-12-01g/ss/loop_table.py's in-order model of the control
codes (a model, not a measurement).

usage: .venv-triton36/bin/python results/cpu_2026-12-01i/kla_split/loop_counts.py OUTDIR/TAG_KERNEL_ROW ...

Every innermost loop of more than 20 instructions is listed, with its instructions per time step: the body divided by
the steps it holds (the kernel's unroll: 4 in the forward kernels, 1 in the backward summary, 2 in the backward walk;
one segment per iteration in the carry kernels; the backward walk's two loops are named recompute and reverse). A loop
that directly follows a longer one of the same kernel is the unrolled loop's remainder (marked "rem", one step per
iteration; it runs only when a chunk or segment is not a multiple of the unroll, never at this shape). FP: FFMA, FMUL,
FADD; 64-bit: IADD3.X, IMAD.WIDE, LEA.HI(.X), IMAD.X.
"""

import math
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "cpu_2026-12-01f"))
sys.path.insert(0, str(HERE.parents[2] / "cpu_2026-12-01g" / "ss"))
from bwd_count import loops  # noqa: E402
from loop_table import LOOP, parse, registers, simulate  # noqa: E402

STEPS = {"fsum": 4, "fcarry": 1, "fwalk": 4, "bsum": 1, "bcarry": 1, "bwalk": 2}
KINDS = [  # (column, pattern on the opcode text without its predicate)
    ("FP", r"(FFMA|FMUL|FADD)\b"),
    ("MUFU", r"MUFU"),
    ("SHFL", r"SHFL"),
    ("STS", r"STS"),
    ("LDS", r"LDS"),
    ("BAR", r"BAR"),
    ("LDGSTS", r"LDGSTS"),
    ("LDG", r"LDG[ .]"),
    ("STG", r"STG"),
    ("F2F/PRMT/I2F", r"F2F|PRMT|I2F"),
    ("ISETP/SEL", r"ISETP|F?SEL\b|PLOP3"),
    ("64-bit", None),
]


def rows(stem: str):
    """(loop label, body size, steps, {kind: count}, one-warp cycles) of each innermost loop of the listing."""
    ins, lines = parse(stem + ".hex.sass")
    kernel = Path(stem).name.split("_")[1]
    previous = 0
    for a, b in loops(lines, *LOOP):
        body = [x for x in ins if not x.get("label") and a <= x["line"] <= b]
        if len(body) <= 20:
            continue
        ops = [re.sub(r"^@!?U?P\w+\s+", "", x["text"]) for x in body]
        found = {k: sum(bool(re.match(p, o)) for o in ops) for k, p in KINDS if p}
        found["64-bit"] = sum(bool(re.search(r"\.X\b|IMAD\.WIDE|LEA\.HI", o)) for o in ops)
        label = "rem" if len(body) < previous else "main"
        if kernel == "bwalk" and label == "main":  # the recompute loop, then the reverse loop
            label = "recompute" if previous == 0 else "reverse"
        previous = len(body)
        yield label, len(body), STEPS[kernel] if label != "rem" else 1, found, simulate(body)[0]


def main() -> None:
    print("| kernel | row | tree | registers (warps/SM) | loop | SASS/iter | steps/iter | **SASS/step** | "
          + " | ".join(k for k, _ in KINDS) + " (per step) | 1-warp cycles/step |")  # fmt: skip
    print("|---|---|---|---|---|---:|---:|---:|" + "---:|" * len(KINDS) + "---:|")
    for stem in sys.argv[1:]:
        tree, kernel, row = Path(stem).name.split("_")
        regs = registers(stem)
        warps = 65536 // (math.ceil(regs * 32 / 256) * 256)
        for label, n, steps, found, cycles in rows(stem):
            per = " | ".join(f"{found[k] / steps:g}" for k, _ in KINDS)
            print(f"| {kernel} | {row} | {tree} | {regs} ({warps}) | {label} | {n} | {steps} | **{n / steps:g}** | "
                  f"{per} | {cycles / steps:g} |")  # fmt: skip


if __name__ == "__main__":
    main()
