"""Where the fixed-latency stalls of the main loops sit: per opcode, instructions and stall-count cycles beyond one
per instruction (the SASS control codes; ../ss/loop_table.py parses them).

usage: .venv-triton36/bin/python results/cpu_2026-12-01g/kla_bwd/stall_hist.py OUTDIR/TAG_bwd_CASE ...
"""

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ss"))
import loop_table as lt  # noqa: E402

for stem in sys.argv[1:]:
    for name, body in lt.main_loops(stem):
        extra, count = Counter(), Counter()
        for x in body:
            op = lt.opcode(x["text"])
            count[op] += 1
            extra[op] += max(x["stall"], 1) - 1
        top = ", ".join(f"{op} {count[op]}/{cycles}" for op, cycles in extra.most_common(12))
        print(f"{Path(stem).name} {name}: {sum(extra.values())} extra stall cycles | {top}")
