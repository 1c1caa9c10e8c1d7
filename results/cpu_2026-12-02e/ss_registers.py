"""Registers, spills and code counts of the selective scan's backward compiled for sm_90 (no GPU needed), as JSON:
`python ss_registers.py PAIR_UNROLL NUM_STAGES` (bwd_block_m 8, chunk 64, one warp; rows fp32 and bf16). Main's
kernel takes UNROLL 4 and ignores PAIR_UNROLL; ss_bwd_half_scratch.patch's takes PAIR_UNROLL."""

import json
import sys

from klalm.kernels.selective_scan import _ss_bwd_kernel
from klalm.kernels.sm90 import code_counts, compile_sm90, resource_usage

BF = 1
flags = dict(HAS_D=True, HAS_INIT=False, HAS_GSTATE=False, HAS_CARRY=False)
launch = dict(BM=8, N_PAD=16, CHUNK=64, NUM_STAGES=int(sys.argv[2]), UNROLL=4, PAIR_UNROLL=int(sys.argv[1]))
out = {}
for name, fm in (("fp32", {}), ("bf16", {"U_FMT": BF, "B_FMT": BF, "C_FMT": BF, "GY_FMT": BF})):
    k = compile_sm90(_ss_bwd_kernel, {**flags, **launch}, fm, num_warps=1)
    out[name] = {**resource_usage(k), **code_counts(k)}
print(json.dumps(out))
