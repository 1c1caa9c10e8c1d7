"""MAD-Lab at lr 5e-4: MAD's weight decay 0.1 against 0 on all six tasks, from results/synthetic/mad.jsonl (held-out
token accuracy %, then sequence accuracy %; mean ± standard error where more than one seed ran). Run from the
repository root:
    .venv/bin/python results/gpu_2026-12-06c/mad_weight_decay.py > results/gpu_2026-12-06c/mad_weight_decay.md
"""

import json
import statistics
from pathlib import Path

ARCHS = ("kla", "gpt", "mamba", "gdn")
TASKS = ("in_context_recall", "noisy_recall", "fuzzy_recall", "selective_copy", "compression", "memorization")
rows = [json.loads(line) for line in Path("results/synthetic/mad.jsonl").read_text().splitlines() if line.strip()]


def accs(task: str, arch: str, wd: float, key: str) -> dict[int, float]:
    """{seed: accuracy %} of the rows at lr 5e-4, the given weight decay and the task's full step count."""
    return {
        r["seed"]: 100 * r[key]
        for r in rows
        if r["task"]["name"] == f"mad_{task}" and r["arch"] == arch and r["train"]["lr"] == 0.0005
        and r["train"]["weight_decay"] == wd and r["steps"] == r["planned_steps"]
    }


def cell(values: dict[int, float]) -> str:
    if not values:
        return "not run"
    if len(values) < 2:
        return f"{next(iter(values.values())):.1f}"
    mean, se = statistics.mean(values.values()), statistics.stdev(values.values()) / len(values) ** 0.5
    return f"{mean:.1f} ± {se:.1f} (n={len(values)})"


for key, title in (("token_acc", "token accuracy %"), ("seq_acc", "sequence accuracy %")):
    print(f"Held-out {title}, lr 5e-4, by MAD weight decay (0 / 0.1):\n")
    print("| task | " + " | ".join(ARCHS) + " |")
    print("| --- | " + " | ".join("---" for _ in ARCHS) + " |")
    for task in TASKS:
        cells = (f"{cell(accs(task, a, 0.0, key))} / {cell(accs(task, a, 0.1, key))}" for a in ARCHS)
        print(f"| {task} | " + " | ".join(cells) + " |")
    print()
