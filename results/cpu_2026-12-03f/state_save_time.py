"""Seconds to save a paused unit's state (`torch.save` of its .pt, loaded to host memory) and to pack its state
folder into state.tar pieces (`klalm.tasks.states.pack_states`), median of five each, on this machine.

    .venv/bin/python results/cpu_2026-12-03f/state_save_time.py .carry/synthetic_state \
        > results/cpu_2026-12-03f/state_save_time.md
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from klalm.tasks.states import pack_states, saved_states


def median_s(work) -> float:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    folder = Path(sys.argv[1])
    print("| state | MiB | save s | pack s |\n| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, info in saved_states(folder).items():
            pt = folder / f"{name}.pt"
            state = torch.load(pt, map_location="cpu", weights_only=True)
            save = median_s(lambda state=state: torch.save(state, Path(tmp) / "state.pt"))
            pack = median_s(lambda: pack_states(folder, Path(tmp) / "out"))
            mib = pt.stat().st_size / 2**20
            print(f"| {info['label']} (step {info['step']}) | {mib:.1f} | {save:.3f} | {pack:.3f} |")
    print(f"\n{torch.get_num_threads()} threads, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()
