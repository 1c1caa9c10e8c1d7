"""GPU: does the selective scan's bwd_block_m 16 (with bf16 rows as fast as fp32 rows at the default, call 1's
ss_bf16_pick.md) slow fp32 rows? Default against bwd_block_m 16 with fp32 and bf16 rows, each twice (the drift), at
ss_bf16_pick.py's shape. From the repository root, on the GPU: python3 results/gpu_2026-12-03c/ss_bm16.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu_2026-12-03b"))
import ss_bf16_pick as pick  # noqa: E402

M16 = pick.D._replace(bwd_block_m=16)
pick.ROWS = [("fp32", "default", pick.D), ("fp32", "bwd_block_m 16", M16), ("bf16", "bwd_block_m 16", M16),
             ("bf16", "default", pick.D), ("fp32", "default, again", pick.D), ("fp32", "bwd_block_m 16, again", M16),
             ("bf16", "bwd_block_m 16, again", M16)]  # fmt: skip
pick.main()
