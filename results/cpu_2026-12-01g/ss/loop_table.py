"""The time loops of compiled kernels (compile_ss.py's OUTDIR/TAG_CASE files): instruction counts, and one warp's
cycles per iteration from a simple in-order model of the SASS control codes. A model, not a measurement.

usage: .venv-triton36/bin/python results/cpu_2026-12-01g/ss/loop_table.py [--waits] OUTDIR/TAG_CASE ...
(compile_loops.py finds the toolkit through the Triton install; e.g. asm/main_bwd_bf16dt32 asm/patch_bwd_bf16dt32).
--waits: instead of the SHFL wait, the cycles spent in issue and every wait by the opcode that caused it.

Model: instructions issue in order; one waits for the scoreboards its wait mask names, then issues, and the next
issues `stall` cycles later (the control code's stall count). A scoreboard written by a variable-latency
instruction is released LATENCY cycles after it issued (read scoreboards after READ_RELEASE). cp.async groups
(DEPBAR) are taken as complete: the loads are pipelined. The loop body runs twice and the second pass is counted.
"SHFL wait" is the part of those cycles spent waiting on a shuffle's result (the butterfly reductions over the
states). Warps per SM follow from the registers (one warp per program, 64K registers per SM).
"""

import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01f"))
from bwd_count import loops  # noqa: E402  (the innermost loops of a SASS listing)
from compile_loops import BIN  # noqa: E402

LATENCY = {"SHFL": 24, "LDS": 30, "LDSM": 32, "MUFU": 20, "F2F": 14, "F2FP": 14, "I2F": 14, "F2I": 14, "BAR": 20,
           "S2R": 20, "S2UR": 20, "LDG": 500, "POPC": 14, "FLO": 14, "BREV": 14, "R2UR": 12, "ULDC": 12}  # fmt: skip
READ_RELEASE = 12
LOOP = (r"^(\.L_x_\d+):", r"BRA `\((\.L_x_\d+)\)")


def parse(path: str) -> tuple[list[dict], list[str]]:
    """`nvdisasm -c -hex` lines -> instructions with their control codes (stall, write/read scoreboard, wait mask)."""
    lines, ins, i = Path(path).read_text().splitlines(), [], 0
    while i < len(lines):
        m = re.search(r"/\*([0-9a-f]{4})\*/\s+(.*?);\s+/\* 0x([0-9a-f]{16}) \*/", lines[i])
        if m:
            control = int(re.search(r"0x([0-9a-f]{16})", lines[i + 1]).group(1), 16) >> 41
            ins.append(dict(text=m.group(2).strip(), stall=control & 15, wr=(control >> 5) & 7,
                            rd=(control >> 8) & 7, wait=(control >> 11) & 63, line=i))  # fmt: skip
            i += 2
        else:
            ins.append(dict(text=lines[i], line=i, label=True))
            i += 1
    return ins, lines


def opcode(text: str) -> str:
    text = re.sub(r"^@!?U?P\w+\s+", "", text)
    return text.split()[0].split(".")[0] if text else ""


def simulate(body: list[dict]) -> tuple[int, Counter, int]:
    """One warp running the loop body twice, the second pass counted: (cycles of one iteration, cycles spent waiting
    on a scoreboard by the opcode that set it ("read": a store's or copy's read scoreboard), cycles spent in issue:
    the sum of stall counts, fixed-latency dependencies included)."""
    t, release, writer, waits, issue, starts = 0, [0] * 6, [None] * 6, Counter(), 0, []
    for second in (False, True):
        starts.append(t)
        for x in body:
            t0, cause = t, None
            for b in range(6):
                if x["wait"] >> b & 1 and release[b] > t:
                    t, cause = release[b], writer[b]
            op = opcode(x["text"])
            if x["wr"] != 7:
                release[x["wr"]], writer[x["wr"]] = t + LATENCY.get(op, 20), op
            if x["rd"] != 7:
                release[x["rd"]], writer[x["rd"]] = max(release[x["rd"]], t + READ_RELEASE), "read"
            if second:
                waits[cause] += t - t0
                issue += max(x["stall"], 1)
            t += max(x["stall"], 1)
    del waits[None]
    return t - starts[-1], waits, issue


def main_loops(stem: str) -> list[tuple[str, list[dict]]]:
    """(name, body) of the unrolled main loops of OUTDIR/TAG_CASE: a backward's recompute and reverse loops, else
    loop 0, 1, ... Loops of 100 instructions or fewer are left out, and so is a loop that directly follows a longer
    one (the unrolled loop's remainder, which runs only when the chunk is not a multiple of the unroll)."""
    ins, lines = parse(stem + ".hex.sass")
    bodies = [[x for x in ins if not x.get("label") and a <= x["line"] <= b] for a, b in loops(lines, *LOOP)]
    bodies = [b for i, b in enumerate(bodies) if len(b) > 100 and (i == 0 or len(b) >= len(bodies[i - 1]))]
    case = Path(stem).name.split("_", 1)[1]
    names = ["loop"] if len(bodies) == 1 else ["recompute", "reverse"] if case.startswith("bwd") else \
        [f"loop {i}" for i in range(len(bodies))]  # fmt: skip
    return list(zip(names, bodies))


def registers(stem: str) -> int:
    out = subprocess.run([str(BIN / "cuobjdump"), "-res-usage", stem + ".cubin"], capture_output=True, text=True)
    return int(re.search(r"REG:(\d+)", out.stdout).group(1))


def main() -> None:
    waits_table = sys.argv[1] == "--waits"  # the waits by opcode and the issue cycles instead of the SHFL wait
    last = "issue | waits by writer |" if waits_table else "SHFL wait |"
    print("| loop | tree | registers (warps/SM) | SASS | LDGSTS | LDG | SHFL | LDS | STS | BAR | F2F | 64-bit int | "
          f"1-warp cycles | {last}")  # fmt: skip
    print("|---|---|---|" + "---:|" * 11 + ("---|" if waits_table else ""))
    for stem in sys.argv[1 + waits_table :]:
        regs = registers(stem)
        warps = 65536 // (math.ceil(regs * 32 / 256) * 256)
        tree, case = Path(stem).name.split("_", 1)
        for name, body in main_loops(stem):
            ops = [re.sub(r"^@!?U?P\w+\s+", "", x["text"]) for x in body]
            count = lambda pattern, ops=ops: sum(bool(re.match(pattern, o)) for o in ops)  # noqa: E731
            wide = sum(bool(re.search(r"\.X\b|IMAD\.WIDE|LEA\.HI", o)) for o in ops)
            cycles, waits, issue = simulate(body)
            tail = f"{issue} | {', '.join(f'{k} {v}' for k, v in waits.most_common())} |" if waits_table else \
                f"{waits['SHFL']} |"  # fmt: skip
            print(f"| {case} {name} | {tree} | {regs} ({warps}) | {len(body)} | {count('LDGSTS')} | "
                  f"{count(r'LDG[ .]')} | {count('SHFL')} | {count('LDS')} | {count('STS')} | {count('BAR')} | "
                  f"{count('F2F')} | {wide} | {cycles} | {tail}")  # fmt: skip


if __name__ == "__main__":
    main()
