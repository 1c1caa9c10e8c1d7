"""Compile the KLA training backward (`_kla_bwd_kernel`) for sm_90 with the installed Triton (no GPU) and write, per
case, OUTDIR/TAG_bwd_CASE.{ttgir,ptx,sass,hex.sass,cubin} (what ../ss/loop_table.py and bwd_count.py read).

usage (repository root of the tree to compile, Triton 3.6 as on the GPU image):
    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-01g/kla_bwd/compile_kla_bwd.py TAG OUTDIR \
        [fp32,bf16,fp32gyv,bf16gyv] [UNROLL=1,NUM_STAGES=2 ...]

Cases: compile_loops.py's backward cases (results/cpu_2026-12-01f), with EVEN_S and EVEN_M set (S = S_PAD = 16 and
M % BM = 0 at the kla_45m shape; a tree without those constants ignores them). Further KEY=VALUE arguments replace
launch constants (the unroll and stage probes).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01f"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ss"))
import compile_loops as cl  # noqa: E402
from compile_ss import write_kernel  # noqa: E402  (the files each compiled case is written as)

if __name__ == "__main__":
    tag, out = sys.argv[1], Path(sys.argv[2])
    cases = cl.CASES["bwd"]
    if len(sys.argv) > 3:
        cases = {c: cases[c] for c in sys.argv[3].split(",")}
    overrides = {k: int(v) for k, v in (a.split("=") for a in sys.argv[4:])}
    out.mkdir(parents=True, exist_ok=True)
    for case, (fn, constexprs, formats, warps, _) in cases.items():
        constexprs = {**constexprs, "EVEN_S": True, "EVEN_M": True, **overrides}
        kernel = cl.compile_sm90(fn, constexprs, formats, warps, constexprs["NUM_STAGES"])
        write_kernel(kernel, out / f"{tag}_bwd_{case}")
        found = cl.resource_usage(kernel) | cl.code_counts(kernel)
        print(
            f"{tag} {case}: " + ", ".join(f"{k} {found[k]}" for k in ("registers", "stack_bytes", "ptx_instructions"))
        )
