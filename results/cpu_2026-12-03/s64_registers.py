"""Registers and spills of the KLA scan kernels at d_state 64 (S_PAD 64) by launch config, compiled for sm_90 by
the installed Triton without a GPU (MQAR's capacity unit trains at this width, under bf16 autocast: bf16 v, k, q and dy rows as the layer passes
them). Run from the repository
root with the GPU image's Triton:

    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-03/s64_registers.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))  # bench_scan.py

import triton

from bench_scan import BF16_ROWS, COMPILED_COLUMNS, TRAINING_FLAGS, print_table
from klalm.kernels.common import BF16_PAIRS, pair_unroll
from klalm.kernels.mobius_scan_bwd import _kla_bwd_kernel
from klalm.kernels.mobius_scan_fwd import _kla_fwd_kernel
from klalm.kernels.sm90 import code_counts, compile_sm90, resource_usage

FLAGS = {**TRAINING_FLAGS, "S_PAD": 64}
ROWS = dict.fromkeys(BF16_ROWS, BF16_PAIRS.value)
rows = []
for bm in (8, 16, 32):
    for warps in (1, 2, 4):
        launch = dict(BM=bm, CHUNK=32, NUM_STAGES=4, UNROLL=4)
        found = resource_usage(kernel := compile_sm90(_kla_fwd_kernel, {**FLAGS, **launch}, ROWS, warps, 4))
        found |= code_counts(kernel)
        rows.append(["fwd", f"BM={bm}, warps={warps}", *(str(found[k]) for k in COMPILED_COLUMNS.values())])
for bm in (2, 4, 8):
    for warps in (1, 2):
        launch = dict(BM=bm, CHUNK=32, NUM_STAGES=3, PAIR_UNROLL=pair_unroll(2))
        found = resource_usage(kernel := compile_sm90(_kla_bwd_kernel, {**FLAGS, **launch}, ROWS, warps, 3))
        found |= code_counts(kernel)
        rows.append(["bwd", f"BM={bm}, warps={warps}", *(str(found[k]) for k in COMPILED_COLUMNS.values())])
print(f"KLA kernels at S_PAD 64, bf16 rows, compiled for sm_90 by Triton {triton.__version__} (training path):")
print_table(["kernel", "launch", *COMPILED_COLUMNS], rows)
