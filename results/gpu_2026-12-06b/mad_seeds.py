"""MAD compression over seeds and MAD weight decay 0.1 at lr 5e-4, from results/synthetic/mad.jsonl (held-out token
accuracy %, mean ± standard error over seeds). Run from the repository root:
    .venv/bin/python results/gpu_2026-12-06b/mad_seeds.py > results/gpu_2026-12-06b/mad_seeds.md
"""

import json
import statistics
from pathlib import Path

ARCHS = ("kla", "gpt", "mamba", "gdn")
rows = [json.loads(line) for line in Path("results/synthetic/mad.jsonl").read_text().splitlines() if line.strip()]


def accs(task: str, arch: str, lr: float, wd: float) -> dict[int, float]:
    return {
        r["seed"]: 100 * r["token_acc"]
        for r in rows
        if r["task"]["name"] == task and r["arch"] == arch and r["train"]["lr"] == lr
        and r["train"]["weight_decay"] == wd and r["train"]["steps"] == 20000
    }


def cell(values: dict[int, float]) -> str:
    if not values:
        return "not run"
    seeds = " / ".join(f"{values[s]:.1f}" for s in sorted(values))
    if len(values) < 2:
        return f"{seeds} (seed {min(values)})"
    mean, se = statistics.mean(values.values()), statistics.stdev(values.values()) / len(values) ** 0.5
    return f"{mean:.1f} ± {se:.1f} ({seeds}; seeds {','.join(map(str, sorted(values)))})"


print("| task, lr, weight decay | " + " | ".join(ARCHS) + " |")
print("| --- | " + " | ".join("---" for _ in ARCHS) + " |")
for task, wd in (("mad_compression", 0.0), ("mad_compression", 0.1), ("mad_fuzzy_recall", 0.0), ("mad_fuzzy_recall", 0.1)):
    print(f"| {task[4:]}, 5e-4, {wd:g} | " + " | ".join(cell(accs(task, a, 0.0005, wd)) for a in ARCHS) + " |")
