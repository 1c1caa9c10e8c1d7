"""Compile the selective scan's training kernels for sm_90 with the installed Triton (no GPU) as `bench_scan.py
--dtypes` launches them, and write each case's TTGIR, PTX, SASS, cubin and SASS with its control codes
(`nvdisasm -c -hex`: the stall counts and scoreboards `loop_table.py` reads) as OUTDIR/TAG_CASE.*.

usage (repository root of the tree to compile, Triton 3.6 as on the GPU image):
    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-01g/ss/compile_ss.py TAG OUTDIR

Cases: fwd_fp32, bwd_fp32 (fp32 u, Δ, B, C) and fwd_bf16dt32, bwd_bf16dt32 (bf16 u, B, C and gradient, fp32 Δ: what
the Mamba layer passes). compile_loops.py (results/cpu_2026-12-01f) holds the launch settings.
"""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01f"))
import compile_loops as cl  # noqa: E402

from klalm.kernels import selective_scan as ss  # noqa: E402

LAYER = dict.fromkeys(("U_FMT", "B_FMT", "C_FMT", "GY_FMT"), cl.B)
CASES = {
    "fwd_fp32": cl.CASES["ss"]["fwd_fp32"],
    "bwd_fp32": cl.CASES["ss"]["bwd_fp32"],
    "fwd_bf16dt32": (ss._ss_fwd_kernel, cl.SS_FWD, LAYER, cl.SS.num_warps, cl.SS.num_stages),
    "bwd_bf16dt32": (ss._ss_bwd_kernel, cl.SS_BWD, LAYER, cl.SS.bwd_num_warps, cl.SS.bwd_num_stages),
}


def write_kernel(kernel, stem: Path) -> None:
    """A compiled kernel's stem.{ttgir,ptx,cubin}, and its SASS plain (stem.sass) and with control codes
    (stem.hex.sass)."""
    for ext in ("ttgir", "ptx"):
        stem.with_suffix(f".{ext}").write_text(kernel.asm[ext])
    stem.with_suffix(".cubin").write_bytes(kernel.asm["cubin"])
    for suffix, flags in ((".sass", ["-c", "-g"]), (".hex.sass", ["-c", "-hex"])):
        text = subprocess.run([str(cl.BIN / "nvdisasm"), *flags, str(stem.with_suffix(".cubin"))],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
        Path(f"{stem}{suffix}").write_text(text)


if __name__ == "__main__":
    tag, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for case, (fn, constexprs, formats, warps, stages) in CASES.items():
        kernel = cl.compile_sm90(fn, constexprs, formats, warps, stages)
        write_kernel(kernel, out / f"{tag}_{case}")
        print(f"{tag} {case}: registers {cl.resource_usage(kernel)['registers']}")
