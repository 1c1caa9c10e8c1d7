"""Compile the KLA training backward (`_kla_bwd_kernel`) for sm_90 (no GPU) in the five rows `bench_scan.py
--dtypes` times, and write OUTDIR/TAG_bwd_CASE.{ttgir,ptx,sass,hex.sass,cubin} (what
../../cpu_2026-12-01g/ss/loop_table.py reads).

usage (from the root of the tree to compile, with that tree's klalm importable, Triton 3.6):
    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-01h/kla_bwd/compile_cases.py TAG OUTDIR \
        [fp32,bf16,fp16,fp32lv,bf16lv] [KEY=VAL ...]

Cases (the --dtypes rows at bwd_block_m 16, y only): fp32 (all rows fp32), bf16 (v, k, q, gy bf16 pairs; Λ fp32),
fp16 (the same with fp16), fp32lv (fp32 rows, LOGVAR), bf16lv (v, log σ², k, q, gy bf16 pairs, LOGVAR). EVEN_S and
EVEN_M are set (S = S_PAD = 16, M % BM = 0; trees without them ignore them). KEY=VAL replaces a launch constant;
MAXNREG=N passes Triton's maxnreg option.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "cpu_2026-12-01f"))
sys.path.insert(0, str(HERE.parents[2] / "cpu_2026-12-01g" / "ss"))
import compile_loops as cl  # noqa: E402
from compile_ss import write_kernel  # noqa: E402

B, H = cl.B, cl.H
BF = dict(V_FMT=B, K_FMT=B, Q_FMT=B, GY_FMT=B)
CASES = {
    "fp32": ({}, {}),
    "bf16": ({}, BF),
    "fp16": ({}, dict(V_FMT=H, K_FMT=H, Q_FMT=H, GY_FMT=H)),
    "fp32lv": (dict(LOGVAR=True), {}),
    "bf16lv": (dict(LOGVAR=True), {**BF, "LV_FMT": B}),
    # probes: the 16-bit rows with k, q passed as float32 (converted on the host)
    "bf16kq32": ({}, dict(V_FMT=B, GY_FMT=B)),
    "bf16lvkq32": (dict(LOGVAR=True), dict(V_FMT=B, GY_FMT=B, LV_FMT=B)),
}


def compile_case(extra, formats, overrides):
    import triton

    maxnreg = overrides.pop("MAXNREG", None)
    constexprs = {**cl.BWD, **extra, "EVEN_S": True, "EVEN_M": True, **overrides}
    fn = cl.mobius_scan_bwd._kla_bwd_kernel
    if maxnreg is None:
        return cl.compile_sm90(fn, constexprs, formats, cl.KLA.bwd_num_warps, constexprs["NUM_STAGES"])
    # compile_sm90 with the maxnreg option (the same signature logic)
    import klalm.kernels.sm90 as sm

    orig = triton.compile

    def patched(src, target=None, options=None, **kw):
        options = dict(options or {})
        options["maxnreg"] = maxnreg
        return orig(src, target=target, options=options, **kw)

    triton.compile = patched
    try:
        return sm.compile_sm90(fn, constexprs, formats, cl.KLA.bwd_num_warps, constexprs["NUM_STAGES"])
    finally:
        triton.compile = orig


if __name__ == "__main__":
    tag, out = sys.argv[1], Path(sys.argv[2])
    names = sys.argv[3].split(",") if len(sys.argv) > 3 and "=" not in sys.argv[3] else list(CASES)
    rest = [a for a in sys.argv[3:] if "=" in a]
    out.mkdir(parents=True, exist_ok=True)
    for case in names:
        extra, formats = CASES[case]
        overrides = {k: int(v) for k, v in (a.split("=") for a in rest)}
        kernel = compile_case(extra, formats, overrides)
        write_kernel(kernel, out / f"{tag}_bwd_{case}")
        found = cl.resource_usage(kernel) | cl.code_counts(kernel)
        print(
            f"{tag} {case}: " + ", ".join(f"{k} {found[k]}" for k in ("registers", "stack_bytes", "ptx_instructions")),
            flush=True,
        )
