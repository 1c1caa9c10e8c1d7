"""The table of MQAR units that ran twice in results/gpu_2026-12-04g (mqar_call1/new.jsonl against
mqar_call2/repeats.jsonl): stop step, how the run ended and final token accuracy of each run, and the first
evaluation (step) at which the two runs' evaluations differ.

    python3 results/gpu_2026-12-04g/repeats_table.py > results/gpu_2026-12-04g/repeats_table.md
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
KEY = ("task", "arch", "n_layers", "d_model", "model_overrides", "train", "seed")


def rows(path: Path) -> dict[str, dict]:
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out[json.dumps({k: row[k] for k in KEY}, sort_keys=True)] = row
    return out


first, second = rows(HERE / "mqar_call1" / "new.jsonl"), rows(HERE / "mqar_call2" / "repeats.jsonl")
print("| unit | call 2: steps, accuracy | call 3: steps, accuracy | first evaluation that differs |")
print("| --- | --- | --- | --- |")
for key, again in second.items():
    once = first[key]
    task = once["task"]
    cell = f"{once['arch']} d={once['d_model']} ({task['length']}, {task['num_pairs']}) lr {once['train']['lr']:g}"
    runs = [f"{r['steps']:,} ({r['ended']}), {100 * r['token_acc']:.2f} %" for r in (once, again)]
    differ = next((a[0] for a, b in zip(once["evals"], again["evals"]) if a != b), "none")
    print(f"| {cell} | {runs[0]} | {runs[1]} | step {differ} |")
