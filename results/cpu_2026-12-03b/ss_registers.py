"""Registers, spills and code counts of the selective scan's backward compiled for sm_90 by the installed Triton
without a GPU, for the launch configs that results/cpu_2026-12-03b/ss_bf16_pick.py times, with fp32 rows and with
the bf16 u, B, C, dy a Mamba layer passes under autocast (training path: D, no initial state, no final-state
gradient, one segment). Prints one Markdown table. From the repository root, with the GPU image's Triton:

    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-03b/ss_registers.py
"""

import triton

from klalm.kernels.bench_scan import COMPILED_COLUMNS, print_table
from klalm.kernels.common import BF16_PAIRS, pair_unroll
from klalm.kernels.selective_scan import DEFAULT_CONFIG, _ss_bwd_kernel
from klalm.kernels.sm90 import code_counts, compile_sm90, resource_usage

D = DEFAULT_CONFIG
CONFIGS = {
    "default": D,
    "bwd_num_stages 2": D._replace(bwd_num_stages=2),
    "bwd_num_stages 4": D._replace(bwd_num_stages=4),
    "bwd_unroll 4": D._replace(bwd_unroll=4),
    "bwd_block_m 16": D._replace(bwd_block_m=16),
    "bwd_block_m 16, 2 warps": D._replace(bwd_block_m=16, bwd_num_warps=2),
    "bwd_block_m 4": D._replace(bwd_block_m=4),
    "chunk 32": D._replace(chunk=32),
    "chunk 128": D._replace(chunk=128),
}
FLAGS = dict(HAS_D=True, HAS_INIT=False, HAS_GSTATE=False, HAS_CARRY=False, N_PAD=16)
BF16 = {name: BF16_PAIRS.value for name in ("U_FMT", "B_FMT", "C_FMT", "GY_FMT")}
rows = []
for name, c in CONFIGS.items():
    launch = dict(BM=c.bwd_block_m, CHUNK=c.chunk, NUM_STAGES=c.bwd_num_stages, PAIR_UNROLL=pair_unroll(c.bwd_unroll))
    for rows_name, formats in (("fp32", {}), ("bf16 u, B, C, dy", BF16)):
        kernel = compile_sm90(_ss_bwd_kernel, {**FLAGS, **launch}, formats, c.bwd_num_warps, c.bwd_num_stages)
        found = resource_usage(kernel) | code_counts(kernel)
        rows.append([name, rows_name, *(str(found[key]) for key in COMPILED_COLUMNS.values())])
print(f"Selective-scan backward at N_PAD 16, compiled for sm_90 by Triton {triton.__version__} (training path):")
print_table(["config", "rows", *COMPILED_COLUMNS], rows)
