"""Compile _kla_bwd_kernel for sm_90 as the training backward launches it; write TTGIR/PTX/SASS.
usage: python bwd_compile.py TAG OUTDIR [cases]"""
import subprocess, sys, tempfile
from pathlib import Path
import triton
from klalm.kernels.common import BF16_PAIRS, ScanConfig
from klalm.kernels import mobius_scan_bwd
from klalm.kernels.mobius_scan_bwd import _kla_bwd_kernel
from klalm.kernels.sm90 import compile_sm90, resource_usage, code_counts

print("module:", mobius_scan_bwd.__file__, file=sys.stderr)
tag = sys.argv[1]
out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
c = ScanConfig()
FLAGS = dict(HAS_INIT=False, PRIOR=False, HAS_GYV=False, HAS_GSTATE=False, HAS_CARRY=False, LOGVAR=False,
             FAST_RCP=True, S_PAD=16, BM=c.bwd_block_m, CHUNK=c.chunk, NUM_STAGES=c.bwd_num_stages, UNROLL=c.bwd_unroll)
B = BF16_PAIRS.value
CASES = {"fp32": ({}, {}), "bf16": (dict(V_FMT=B, K_FMT=B, Q_FMT=B, GY_FMT=B), {}),
         "fp32gyv": ({}, dict(HAS_GYV=True)), "bf16gyv": (dict(V_FMT=B, K_FMT=B, Q_FMT=B, GY_FMT=B, GYV_FMT=B), dict(HAS_GYV=True))}
if len(sys.argv) > 3:
    CASES = {k: CASES[k] for k in sys.argv[3].split(",")}
for case, (fmts, extra) in CASES.items():
    k = compile_sm90(_kla_bwd_kernel, {**FLAGS, **extra}, fmts, c.bwd_num_warps, c.bwd_num_stages)
    stem = out / f"{tag}_{case}"
    stem.with_suffix(".ttgir").write_text(k.asm["ttgir"])
    stem.with_suffix(".ptx").write_text(k.asm["ptx"])
    with tempfile.TemporaryDirectory() as tmp:
        cub = Path(tmp) / "k.cubin"; cub.write_bytes(k.asm["cubin"])
        sass = subprocess.run([str(BIN / "nvdisasm"), "-c", "-g", str(cub)], capture_output=True, text=True).stdout
        if not sass.strip():
            sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", str(cub)], capture_output=True, text=True).stdout
    stem.with_suffix(".sass").write_text(sass)
    ru = resource_usage(k) | code_counts(k)
    print(f"{tag} {case}: regs {ru['registers']} stack {ru['stack_bytes']} shared {ru['shared_bytes']} "
          f"ptx {ru['ptx_instructions']} bar {ru['bar_sync']} cvt_layout {ru['convert_layout']}", flush=True)
