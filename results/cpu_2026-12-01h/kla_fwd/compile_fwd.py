"""Compile the KLA forward (`_kla_fwd_kernel`) for sm_90 with the installed Triton (no GPU) and write, per case,
OUTDIR/TAG_CASE.{ttgir,ptx,sass,hex.sass,cubin} (what results/cpu_2026-12-01f/bf16_count.py and
results/cpu_2026-12-01g/ss/loop_table.py read).

usage (repository root of the tree to compile, Triton 3.6 as on the GPU image):
    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-01h/kla_fwd/compile_fwd.py TAG OUTDIR \
        [CASE,...]

Cases: compile_loops.py's forward training cases fp32tr (fp32 v, Λ, k, q) and bf16tr (bf16 v, k, q; fp32 Λ: the
layer's), fp16tr, and the log-variance training forward as bench_scan.py --dtypes runs it: fp32lvtr (fp32 v,
log σ², k, q) and bf16lvtr (bf16 v, log σ², k, q). All with SAVE_CKPT and without y_var (the training forward).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cpu_2026-12-01f"))
sys.path.insert(0, str(ROOT / "cpu_2026-12-01g" / "ss"))
import compile_loops as cl  # noqa: E402
from compile_ss import write_kernel  # noqa: E402

TR = dict(SAVE_CKPT=True, WITH_VAR=False, Y_FMT=0)  # Y_FMT: the candidates' y words (a tree without it ignores it)
BF16 = {**cl.FWD_BF16, "Y_FMT": cl.B}  # Y_FMT in formats: y_ptr an int32 pointer where kernels/sm90.py knows Y_FMT
CASES = {
    "fp32tr": cl.fwd(TR, {}),
    "bf16tr": cl.fwd(TR, BF16),
    "fp16tr": cl.fwd(TR, dict(V_FMT=cl.H, K_FMT=cl.H, Q_FMT=cl.H, Y_FMT=cl.H)),
    "fp32lvtr": cl.fwd({**TR, "LOGVAR": True}, {}),
    "bf16lvtr": cl.fwd({**TR, "LOGVAR": True}, {**BF16, "LV_FMT": cl.B}),
}


def main(all_cases: dict) -> None:
    """Compile the cases the command line names (all without a third argument) and print their resources."""
    tag, out = sys.argv[1], Path(sys.argv[2])
    cases = all_cases if len(sys.argv) < 4 else {c: all_cases[c] for c in sys.argv[3].split(",")}
    out.mkdir(parents=True, exist_ok=True)
    for case, (fn, constexprs, formats, warps, stages) in cases.items():
        kernel = cl.compile_sm90(fn, constexprs, formats, warps, stages)
        write_kernel(kernel, out / f"{tag}_{case}")
        found = cl.resource_usage(kernel) | cl.code_counts(kernel)
        print(
            f"{tag} {case}: "
            + ", ".join(f"{k} {found[k]}" for k in ("registers", "stack_bytes", "ptx_instructions", "bar_sync"))
        )


if __name__ == "__main__":
    main(CASES)
