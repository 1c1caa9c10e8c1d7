"""Compile _ss_fwd_kernel / _ss_bwd_kernel for sm_90 (training path, DEFAULT_CONFIG), fp32 and bf16 rows.
usage: python ss_compile.py TAG OUTDIR"""
import subprocess, sys, tempfile
from pathlib import Path
import triton
from klalm.kernels.common import BF16_PAIRS
import klalm.kernels.selective_scan as ss
from klalm.kernels.sm90 import compile_sm90, resource_usage
print("module", ss.__file__, file=sys.stderr)
tag = sys.argv[1]
out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
C = ss.DEFAULT_CONFIG
FWD = dict(BM=C.block_m, N_PAD=16, CHUNK=C.chunk, NUM_STAGES=C.num_stages, UNROLL=C.unroll, HAS_D=True, HAS_INIT=False, SAVE_CKPT=True)
BWD = dict(BM=C.bwd_block_m, N_PAD=16, CHUNK=C.chunk, NUM_STAGES=C.bwd_num_stages, UNROLL=C.bwd_unroll, HAS_D=True, HAS_INIT=False,
           HAS_GSTATE=False, HAS_CARRY=False)
BF = {f: BF16_PAIRS.value for f in ("U_FMT", "DT_FMT", "B_FMT", "C_FMT", "GY_FMT")}
CASES = {"fwd_fp32": (ss._ss_fwd_kernel, FWD, {}, C.num_warps, C.num_stages), "fwd_bf16": (ss._ss_fwd_kernel, FWD, BF, C.num_warps, C.num_stages),
         "bwd_fp32": (ss._ss_bwd_kernel, BWD, {}, C.bwd_num_warps, C.bwd_num_stages), "bwd_bf16": (ss._ss_bwd_kernel, BWD, BF, C.bwd_num_warps, C.bwd_num_stages)}
for case, (fn, cx, fmts, nw, ns) in CASES.items():
    k = compile_sm90(fn, cx, fmts, nw, ns)
    stem = out / f"{tag}_{case}"
    stem.with_suffix(".ttgir").write_text(k.asm["ttgir"])
    stem.with_suffix(".ptx").write_text(k.asm["ptx"])
    with tempfile.TemporaryDirectory() as tmp:
        cub = Path(tmp) / "k.cubin"; cub.write_bytes(k.asm["cubin"])
        sass = subprocess.run([str(BIN / "nvdisasm"), "-c", "-g", str(cub)], capture_output=True, text=True).stdout
    stem.with_suffix(".sass").write_text(sass)
    ru = resource_usage(k)
    print(f"{tag} {case}: regs {ru['registers']} stack {ru['stack_bytes']} shared {ru['shared_bytes']} cvt_layout {k.asm['ttgir'].count('ttg.convert_layout')} bar {k.asm['ptx'].count('bar.sync')}")
