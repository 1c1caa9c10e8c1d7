"""results/cpu_2026-12-01h/kla_fwd/compile_fwd.py's cases, with y as the gated patch's host passes it, and the
forward with y_var: OUTDIR/TAG_CASE.{ttgir,ptx,sass,hex.sass,cubin} for the same readers.

usage (repository root of the tree to compile, Triton 3.6 as on the GPU image):
    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-01i/kla_fwd/compile_fwd_gated.py TAG OUTDIR \
        [CASE,...]

Cases: compile_fwd.py's fp32tr, bf16tr, fp16tr, fp32lvtr as they are; bf16lvtr with y a plain bf16 pointer (Y_FMT
PLAIN), as HEAD's and the gated patch's `mobius_scan_fwd` launch it (compile_fwd.py's bf16lvtr passes y as int32
words, which only the ungated change launches and the gated kernel rejects); and the training forward WITH y_var
(SAVE_CKPT, WITH_VAR=True, y plain): bf16trv (bf16 v, k, q, fp32 Λ), fp16trv, bf16lvtrv (bf16 v, log σ², k, q).
A tree without Y_FMT ignores it.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01h" / "kla_fwd"))
import compile_fwd as cf  # noqa: E402
from compile_fwd import cl, main  # noqa: E402

LV = {**cf.TR, "LOGVAR": True}
TRV = {**cf.TR, "WITH_VAR": True}
FP16 = dict(V_FMT=cl.H, K_FMT=cl.H, Q_FMT=cl.H)
CASES = {
    **cf.CASES,
    "bf16lvtr": cl.fwd(LV, {**cl.FWD_BF16, "LV_FMT": cl.B}),
    "bf16trv": cl.fwd(TRV, cl.FWD_BF16),
    "fp16trv": cl.fwd(TRV, FP16),
    "bf16lvtrv": cl.fwd({**LV, "WITH_VAR": True}, {**cl.FWD_BF16, "LV_FMT": cl.B}),
}

if __name__ == "__main__":
    main(CASES)
