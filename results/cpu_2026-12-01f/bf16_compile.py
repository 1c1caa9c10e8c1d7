"""Compile _kla_fwd_kernel for sm_90 (fp32 rows vs bf16 v,k,q pairs), as --dtypes' no-grad fwd launches it, and
write TTGIR/PTX/SASS + per-loop counts.  usage: python bf16_compile.py TAG [OUTDIR]"""
import re, subprocess, sys, tempfile
from pathlib import Path
import triton
from klalm.kernels.common import BF16_PAIRS, FP16_PAIRS
from klalm.kernels.mobius_scan_fwd import _kla_fwd_kernel
from klalm.kernels.sm90 import compile_sm90, resource_usage

tag = sys.argv[1]
out = Path(sys.argv[2] if len(sys.argv) > 2 else "asm")
out.mkdir(parents=True, exist_ok=True)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# the no-grad forward of --dtypes (kla_scan_triton under torch.no_grad: save_ckpt False, one segment)
FLAGS = dict(HAS_INIT=False, PRIOR=False, SAVE_CKPT=False, LOGVAR=False, INIT_COV=False, WITH_VAR=True, FAST_RCP=True, S_PAD=16,
             BM=32, CHUNK=32, NUM_STAGES=4, UNROLL=4)
CASES = {"fp32": {}, "bf16": dict(V_FMT=BF16_PAIRS.value, K_FMT=BF16_PAIRS.value, Q_FMT=BF16_PAIRS.value),
         "fp16": dict(V_FMT=FP16_PAIRS.value, K_FMT=FP16_PAIRS.value, Q_FMT=FP16_PAIRS.value)}
if len(sys.argv) > 3:
    CASES = {k: CASES[k] for k in sys.argv[3].split(",")}
for case, fmts in CASES.items():
    k = compile_sm90(_kla_fwd_kernel, FLAGS, fmts, 1, 4)
    stem = out / f"{tag}_{case}"
    (stem.with_suffix(".ttgir")).write_text(k.asm["ttgir"])
    (stem.with_suffix(".ptx")).write_text(k.asm["ptx"])
    with tempfile.TemporaryDirectory() as tmp:
        cub = Path(tmp) / "k.cubin"; cub.write_bytes(k.asm["cubin"])
        sass = subprocess.run([str(BIN / "nvdisasm"), "-c", "-g", str(cub)], capture_output=True, text=True).stdout
        if not sass.strip():
            sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", str(cub)], capture_output=True, text=True).stdout
    (stem.with_suffix(".sass")).write_text(sass)
    ru = resource_usage(k)
    print(f"{tag} {case}: regs {ru['registers']} stack {ru['stack_bytes']} shared {ru['shared_bytes']}")
