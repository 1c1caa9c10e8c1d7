"""Registers, spills and code counts of the selective scan's backward compiled for sm_90 by the installed Triton
without a GPU, for the launch configs that results/cpu_2026-12-03b/ss_bf16_pick.py times, with fp32 rows and with
the bf16 u, B, C, dy a Mamba layer passes under autocast (training path: D, no initial state, no final-state
gradient, one segment). Prints one Markdown table. From the repository root, with the GPU image's Triton:

    env -u TRITON_INTERPRET .venv-triton36/bin/python results/cpu_2026-12-03b/ss_registers.py
"""

import sys
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).parent))  # ss_bf16_pick.py
from ss_bf16_pick import CANDIDATES  # noqa: E402

from klalm.kernels.bench_scan import COMPILED_COLUMNS, print_table
from klalm.kernels.common import BF16_PAIRS, pair_unroll
from klalm.kernels.selective_scan import DEFAULT_CONFIG, _ss_bwd_kernel
from klalm.kernels.sm90 import code_counts, compile_sm90, resource_usage

CONFIGS = {"default": DEFAULT_CONFIG, **CANDIDATES}  # the configs ss_bf16_pick.py times
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
