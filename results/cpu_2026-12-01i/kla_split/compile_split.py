"""Compile the KLA scan's time-parallel kernels (and, to compare, the walk kernels) for sm_90 (no GPU) as
`kernels/mobius_scan.py` launches them for a kla_45m layer at T = 16384 in training: B2 L16384 M1024 S16, which
`common.segment_chunks` cuts into 32 segments of 512 steps (seg_chunks 16 at chunk 32), no initial state, no y_var,
Λ given (LOGVAR False), no final-state gradient. Writes OUTDIR/TAG_KERNEL_ROW.{ttgir,ptx,cubin,sass,hex.sass}
(what loop_counts.py reads).

usage (from the root of the tree to compile, with that tree's klalm importable, Triton 3.6):
    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-01i/kla_split/compile_split.py TAG OUTDIR \
        [KERNEL,...] [ROW,...]

KERNEL: fsum, fcarry, fwalk, bsum, bcarry, bwalk (default all); ROW: bf16 (the layer's: bf16 v, k, q, gy rows read as
pairs, fp32 Λ) and fp32 (every row fp32) (default both). The launch constants are ScanConfig's defaults, as
`_segment_starts`, `mobius_scan_fwd`, `_adjoint_carry` and `mobius_scan_bwd` pass them; the launch option
num_stages is Triton's default (3) where the launch does not pass it (the forward kernels, both carry kernels).
Constants a patched tree may add (EVEN_S, EVEN_M: S == S_PAD and M % BM == 0 here) are passed to every kernel and
ignored by kernels without them.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "cpu_2026-12-01f"))
sys.path.insert(0, str(HERE.parents[2] / "cpu_2026-12-01g" / "ss"))
import compile_loops as cl  # noqa: E402
from compile_ss import write_kernel  # noqa: E402

from klalm.kernels import mobius_scan_bwd as bwd  # noqa: E402
from klalm.kernels import mobius_scan_fwd as fwd  # noqa: E402
from klalm.kernels.common import SUMMARY_UNROLL, ScanConfig  # noqa: E402

B = cl.B
CFG = ScanConfig()
LAUNCH_DEFAULT_STAGES = 3  # Triton's CUDA default for the launch option num_stages
COMMON = dict(S_PAD=16, FAST_RCP=True, LOGVAR=False, EVEN_S=True, EVEN_M=True)
FWD = dict(COMMON, BM=CFG.block_m, NUM_STAGES=CFG.num_stages, UNROLL=CFG.unroll, CHUNK=CFG.chunk)
BWD = dict(COMMON, BM=CFG.bwd_block_m, NUM_STAGES=CFG.bwd_num_stages, UNROLL=CFG.bwd_unroll, CHUNK=CFG.chunk,
           PRIOR=False, HAS_GYV=False)  # fmt: skip
ROWS = {"bf16": dict(V_FMT=B, K_FMT=B, Q_FMT=B, GY_FMT=B), "fp32": {}}  # Λ fp32 in both
KERNELS = {  # name -> (kernel, constexprs, warps, launch num_stages)
    "fsum": (fwd._kla_fwd_summary_kernel, FWD, CFG.num_warps, LAUNCH_DEFAULT_STAGES),
    "fcarry": (fwd._kla_fwd_carry_kernel, dict(FWD, HAS_INIT=False), CFG.num_warps, LAUNCH_DEFAULT_STAGES),
    "fwalk": (
        fwd._kla_fwd_kernel,
        dict(FWD, HAS_INIT=True, PRIOR=False, SAVE_CKPT=True, INIT_COV=True, WITH_VAR=False),
        CFG.num_warps,
        LAUNCH_DEFAULT_STAGES,
    ),  # fmt: skip
    "bsum": (bwd._kla_bwd_summary_kernel, dict(BWD, UNROLL=SUMMARY_UNROLL), CFG.bwd_num_warps, CFG.bwd_num_stages),
    "bcarry": (bwd._kla_bwd_carry_kernel, dict(BWD, HAS_GSTATE=False), CFG.bwd_num_warps, CFG.bwd_num_stages),
    "bwalk": (
        bwd._kla_bwd_kernel,
        dict(BWD, HAS_INIT=False, HAS_GSTATE=False, HAS_CARRY=True),
        CFG.bwd_num_warps,
        CFG.bwd_num_stages,
    ),  # fmt: skip
}


def main() -> None:
    tag, out = sys.argv[1], Path(sys.argv[2])
    kernels = sys.argv[3].split(",") if len(sys.argv) > 3 else list(KERNELS)
    rows = sys.argv[4].split(",") if len(sys.argv) > 4 else list(ROWS)
    out.mkdir(parents=True, exist_ok=True)
    for name in kernels:
        fn, constexprs, warps, stages = KERNELS[name]
        for row in rows:
            kernel = cl.compile_sm90(fn, constexprs, ROWS[row], warps, stages)
            write_kernel(kernel, out / f"{tag}_{name}_{row}")
            found = cl.resource_usage(kernel) | cl.code_counts(kernel)
            print(f"{tag} {name} {row}: " + ", ".join(f"{k} {found[k]}" for k in
                  ("registers", "stack_bytes", "shared_bytes", "ptx_instructions", "bar_sync", "convert_layout")),
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
