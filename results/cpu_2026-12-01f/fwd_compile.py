"""Compile _kla_fwd_kernel for sm_90 (no-grad and training forward, fp32 and bf16 rows); write TTGIR/PTX/SASS.
usage: python compile.py TAG OUTDIR [cases]"""
import subprocess, sys, tempfile
from pathlib import Path
import triton
from klalm.kernels.common import BF16_PAIRS
import klalm.kernels.mobius_scan_fwd as mf
from klalm.kernels.sm90 import compile_sm90, resource_usage
print("module", mf.__file__, file=sys.stderr)
tag = sys.argv[1]
out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
BASE = dict(HAS_INIT=False, PRIOR=False, SAVE_CKPT=False, LOGVAR=False, INIT_COV=False, FAST_RCP=True, S_PAD=16,
            BM=32, CHUNK=32, NUM_STAGES=4, UNROLL=4, WITH_VAR=True)
BF = dict(V_FMT=BF16_PAIRS.value, K_FMT=BF16_PAIRS.value, Q_FMT=BF16_PAIRS.value)
CASES = {"fp32": ({}, {}), "bf16": ({}, BF), "fp32tr": (dict(SAVE_CKPT=True, WITH_VAR=False), {}), "bf16tr": (dict(SAVE_CKPT=True, WITH_VAR=False), BF),
         "fp32trv": (dict(SAVE_CKPT=True), {}), "bf16trv": (dict(SAVE_CKPT=True), BF),
         "fp32bm64": (dict(BM=64), {}), "bf16lv": (dict(LOGVAR=True), BF)}
if len(sys.argv) > 3:
    CASES = {k: CASES[k] for k in sys.argv[3].split(",")}
for case, (extra, fmts) in CASES.items():
    k = compile_sm90(mf._kla_fwd_kernel, {**BASE, **extra}, fmts, 1, 4)
    stem = out / f"{tag}_{case}"
    stem.with_suffix(".ttgir").write_text(k.asm["ttgir"])
    stem.with_suffix(".ptx").write_text(k.asm["ptx"])
    with tempfile.TemporaryDirectory() as tmp:
        cub = Path(tmp) / "k.cubin"; cub.write_bytes(k.asm["cubin"])
        sass = subprocess.run([str(BIN / "nvdisasm"), "-c", "-g", str(cub)], capture_output=True, text=True).stdout
    stem.with_suffix(".sass").write_text(sass)
    ru = resource_usage(k)
    print(f"{tag} {case}: regs {ru['registers']} stack {ru['stack_bytes']} shared {ru['shared_bytes']}")
