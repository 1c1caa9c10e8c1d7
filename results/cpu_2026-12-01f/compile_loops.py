"""Compile a scan's kernels for sm_90 with the installed Triton (no GPU) and write each case's TTGIR, PTX and SASS
(nvdisasm's format, which bf16_count.py and bwd_count.py parse) as OUTDIR/TAG_CASE.{ttgir,ptx,sass}.

usage: env -u TRITON_INTERPRET python compile_loops.py {fwd,bwd,ss} TAG OUTDIR [CASE,...]

fwd: the KLA forward at the default launch (no-grad with y_var: fp32, bf16, fp16 rows; the training forward
     without y_var: *tr, with it: *trv; block_m 64: fp32bm64; log σ² in: bf16lv); bwd: the KLA training backward
     (y only, or with the y_var gradient: *gyv); ss: the selective scan's training forward and backward.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import triton

from klalm.kernels import mobius_scan_bwd, mobius_scan_fwd, selective_scan
from klalm.kernels.common import BF16_PAIRS, FP16_PAIRS, ScanConfig
from klalm.kernels.sm90 import code_counts, compile_sm90, resource_usage

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
B, H = BF16_PAIRS.value, FP16_PAIRS.value
KLA, SS = ScanConfig(), selective_scan.DEFAULT_CONFIG

FWD = dict(HAS_INIT=False, PRIOR=False, SAVE_CKPT=False, LOGVAR=False, INIT_COV=False, FAST_RCP=True, S_PAD=16,
           BM=KLA.block_m, CHUNK=KLA.chunk, NUM_STAGES=KLA.num_stages, UNROLL=KLA.unroll, WITH_VAR=True)
FWD_BF16 = dict(V_FMT=B, K_FMT=B, Q_FMT=B)
BWD = dict(HAS_INIT=False, PRIOR=False, HAS_GYV=False, HAS_GSTATE=False, HAS_CARRY=False, LOGVAR=False, FAST_RCP=True,
           S_PAD=16, BM=KLA.bwd_block_m, CHUNK=KLA.chunk, NUM_STAGES=KLA.bwd_num_stages, UNROLL=KLA.bwd_unroll)
BWD_BF16 = dict(V_FMT=B, K_FMT=B, Q_FMT=B, GY_FMT=B)
SS_FWD = dict(BM=SS.block_m, N_PAD=16, CHUNK=SS.chunk, NUM_STAGES=SS.num_stages, UNROLL=SS.unroll, HAS_D=True,
              HAS_INIT=False, SAVE_CKPT=True)
SS_BWD = dict(BM=SS.bwd_block_m, N_PAD=16, CHUNK=SS.chunk, NUM_STAGES=SS.bwd_num_stages, UNROLL=SS.bwd_unroll,
              HAS_D=True, HAS_INIT=False, HAS_GSTATE=False, HAS_CARRY=False)
SS_BF16 = dict.fromkeys(("U_FMT", "DT_FMT", "B_FMT", "C_FMT", "GY_FMT"), B)

fwd = lambda extra, formats: (mobius_scan_fwd._kla_fwd_kernel, {**FWD, **extra}, formats, KLA.num_warps, KLA.num_stages)
bwd = lambda extra, formats: (mobius_scan_bwd._kla_bwd_kernel, {**BWD, **extra}, formats, KLA.bwd_num_warps,
                              KLA.bwd_num_stages)
CASES = {  # set -> case -> (kernel, constexprs, row formats, warps, stages)
    "fwd": {
        "fp32": fwd({}, {}), "bf16": fwd({}, FWD_BF16), "fp16": fwd({}, dict(V_FMT=H, K_FMT=H, Q_FMT=H)),
        "fp32tr": fwd(dict(SAVE_CKPT=True, WITH_VAR=False), {}),
        "bf16tr": fwd(dict(SAVE_CKPT=True, WITH_VAR=False), FWD_BF16),
        "fp32trv": fwd(dict(SAVE_CKPT=True), {}), "bf16trv": fwd(dict(SAVE_CKPT=True), FWD_BF16),
        "fp32bm64": fwd(dict(BM=64), {}), "bf16lv": fwd(dict(LOGVAR=True), FWD_BF16),
    },
    "bwd": {
        "fp32": bwd({}, {}), "bf16": bwd({}, BWD_BF16),
        "fp32gyv": bwd(dict(HAS_GYV=True), {}), "bf16gyv": bwd(dict(HAS_GYV=True), {**BWD_BF16, "GYV_FMT": B}),
    },
    "ss": {
        "fwd_fp32": (selective_scan._ss_fwd_kernel, SS_FWD, {}, SS.num_warps, SS.num_stages),
        "fwd_bf16": (selective_scan._ss_fwd_kernel, SS_FWD, SS_BF16, SS.num_warps, SS.num_stages),
        "bwd_fp32": (selective_scan._ss_bwd_kernel, SS_BWD, {}, SS.bwd_num_warps, SS.bwd_num_stages),
        "bwd_bf16": (selective_scan._ss_bwd_kernel, SS_BWD, SS_BF16, SS.bwd_num_warps, SS.bwd_num_stages),
    },
}


def main() -> None:
    kernel_set, tag, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    cases = CASES[kernel_set]
    if len(sys.argv) > 4:
        cases = {name: cases[name] for name in sys.argv[4].split(",")}
    out.mkdir(parents=True, exist_ok=True)
    for case, (fn, constexprs, formats, warps, stages) in cases.items():
        kernel = compile_sm90(fn, constexprs, formats, warps, stages)
        stem = out / f"{tag}_{case}"
        stem.with_suffix(".ttgir").write_text(kernel.asm["ttgir"])
        stem.with_suffix(".ptx").write_text(kernel.asm["ptx"])
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / "kernel.cubin"
            cubin.write_bytes(kernel.asm["cubin"])
            sass = subprocess.run([str(BIN / "nvdisasm"), "-c", "-g", str(cubin)], capture_output=True, text=True)
        stem.with_suffix(".sass").write_text(sass.stdout)
        found = resource_usage(kernel) | code_counts(kernel)
        print(f"{tag} {case}: " + ", ".join(f"{key} {found[key]}" for key in
              ("registers", "stack_bytes", "shared_bytes", "ptx_instructions", "bar_sync", "convert_layout")))


if __name__ == "__main__":
    main()
