"""Registers, spills and code counts of the KLA scan kernels at S_PAD 16 and 8 (the widths of kla_45m's scan and of
its two slices in state_slices.py), default launch parameters, bf16 v, k, q, dy rows as the layer passes them,
compiled for sm_90 by the installed Triton without a GPU. Prints one Markdown table. From the repository root:

    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-03b/slice_registers.py
"""

import triton

from klalm.kernels.bench_scan import BF16_ROWS, COMPILED_COLUMNS, TRAINING_FLAGS, print_table
from klalm.kernels.common import BF16_PAIRS, pair_unroll
from klalm.kernels.mobius_scan import DEFAULT_CONFIG as C
from klalm.kernels.mobius_scan_bwd import _kla_bwd_kernel
from klalm.kernels.mobius_scan_fwd import _kla_fwd_kernel
from klalm.kernels.sm90 import code_counts, compile_sm90, resource_usage

ROWS = dict.fromkeys(BF16_ROWS, BF16_PAIRS.value)
rows = []
for s_pad in (16, 8):
    flags = {**TRAINING_FLAGS, "S_PAD": s_pad}
    fwd = dict(BM=C.block_m, CHUNK=C.chunk, NUM_STAGES=C.num_stages, UNROLL=C.unroll)
    bwd = dict(BM=C.bwd_block_m, CHUNK=C.chunk, NUM_STAGES=C.bwd_num_stages, PAIR_UNROLL=pair_unroll(C.bwd_unroll))
    kernels = [("fwd", _kla_fwd_kernel, fwd, C.num_warps, C.num_stages),
               ("bwd", _kla_bwd_kernel, bwd, C.bwd_num_warps, C.bwd_num_stages)]  # fmt: skip
    for name, fn, launch, warps, stages in kernels:
        found = resource_usage(kernel := compile_sm90(fn, {**flags, **launch}, ROWS, warps, stages))
        found |= code_counts(kernel)
        rows.append([name, str(s_pad), f"BM={launch['BM']}", *(str(found[k]) for k in COMPILED_COLUMNS.values())])
print(f"KLA kernels by S_PAD, default launch {tuple(C)}, bf16 rows, sm_90, Triton {triton.__version__} (training):")
print_table(["kernel", "S_PAD", "launch", *COMPILED_COLUMNS], rows)
