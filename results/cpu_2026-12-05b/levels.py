"""Deflate levels on a paused state, its bytes as they are and in four byte planes (what `pack_states` writes).

    .venv/bin/python results/cpu_2026-12-05b/levels.py .carry/synthetic_state/30959d0259f84ef3.pt > levels.md
"""

import sys
import time
import zlib
from pathlib import Path

data = Path(sys.argv[1]).read_bytes()
planes = b"".join(data[offset::4] for offset in range(4))
print(f"`{Path(sys.argv[1]).name}`, {len(data) / 2**20:.1f} MiB\n")
print("| bytes | level | MiB | s (this machine) |\n| --- | ---: | ---: | ---: |")
for name, blob in (("as they are", data), ("in 4 planes", planes)):
    for level in (1, 6, 9):
        start = time.perf_counter()
        size = len(zlib.compress(blob, level))
        print(f"| {name} | {level} | {size / 2**20:.1f} | {time.perf_counter() - start:.1f} |")
print("\n| plane (byte of each 4) | deflated, level 1, share of its size |\n| ---: | ---: |")
for offset in range(4):
    plane = data[offset::4]
    print(f"| {offset} | {len(zlib.compress(plane, 1)) / len(plane):.3f} |")
