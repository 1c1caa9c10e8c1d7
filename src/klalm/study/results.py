"""The study's committed results folder: what one finished run leaves, and how it is read back.

    <results>/sweep/<model>-lr<lr>/   run.json, train.csv, val.csv, train.log
    <results>/runs/<model>-s<seed>/   run.json, train.csv, val.csv, train.log, eval.json (klalm-eval's results.json)

`collect` makes them from a run folder, where the runner leaves cell.json (what was launched: the cell, the exact
command and overrides, the data trained on, GPU, versions, commit, date), timing.json (wall seconds of training,
validation and zero-shot evaluation), val_full.json (the whole validation shard), csv/metrics.csv, summary.json
and zero_shot/results.json. run.json adds the measured throughput and GPU time. A cell counts as done when its
run.json exists, so a re-run of the runner skips it.
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from klalm.fileio import write_atomic
from klalm.study.files import read_json
from klalm.study.spec import Cell, Spec

RUN_FILE = "run.json"
CELL_FILE = "cell.json"
TIMING_FILE = "timing.json"
VAL_FILE = "val_full.json"
ZERO_SHOT_DIR = "zero_shot"
LOG_TAIL_BYTES = 200_000  # the end of the training output kept as train.log
TRAIN_COLUMNS = ("train/loss", "train/lr", "train/grad_norm", "train/tokens_seen", "perf/tokens_per_s")


def cell_dir(spec: Spec, cell: Cell | dict[str, Any]) -> Path:
    sweep, name = (cell.sweep, cell.name) if isinstance(cell, Cell) else (cell["sweep"], cell["cell"])
    return spec.results / ("sweep" if sweep else "runs") / name


def load_run(spec: Spec, cell: Cell) -> dict[str, Any] | None:
    """The run.json of a finished cell, or None."""
    path = cell_dir(spec, cell) / RUN_FILE
    return read_json(path) if path.is_file() else None


def finished(spec: Spec, sweep: bool) -> list[dict[str, Any]]:
    """run.json of every finished cell of the sweep or of the runs, in folder order."""
    folder = spec.results / ("sweep" if sweep else "runs")
    return [read_json(p) for p in sorted(folder.glob(f"*/{RUN_FILE}"))]


def best_lr(spec: Spec, model: str) -> float | None:
    """The swept learning rate with the lowest whole-shard validation loss, once every lr of the sweep has run."""
    rows = [r for r in finished(spec, sweep=True) if r["model"] == model]
    if {r["lr"] for r in rows} != {float(lr) for lr in spec.sweep["lrs"][model]}:
        return None
    return min(rows, key=lambda r: r["val"]["loss"])["lr"]


def tokens_per_s_per_gpu(spec: Spec, model: str) -> tuple[float, str]:
    """This study's measured training rate of a model (tokens/s per GPU) and where it came from."""
    rows = [r for r in [*finished(spec, sweep=False), *finished(spec, sweep=True)] if r["model"] == model]
    if rows:
        return rows[0]["throughput"]["tokens_per_s_per_gpu"], f"measured ({rows[0]['cell']})"
    return float(spec.estimate["prior_tokens_per_s"][model]), "prior (docs/benchmarks.md)"


def bench_rates(paths: list[str | Path]) -> dict[str, tuple[float, str]]:
    """One-GPU tokens/s by model from committed `scripts/bench_lm.py` rows (its `--out` .json files) at the study's
    shape (B16 × T2048, no compile), with the file each came from; the first file that has a model wins."""
    rates: dict[str, tuple[float, str]] = {}
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"study cost.bench_rows: {path} does not exist (a bench_lm.py --out .json file)")
        for row in read_json(path):
            setting, speed = row.get("setting", {}), row.get("perf/tokens_per_s")
            at_study_shape = (setting.get("batch_size"), setting.get("seq_len"), setting.get("compile")) == (
                16, 2048, False)  # fmt: skip
            if at_study_shape and speed and row["model"] not in rates:
                rates[row["model"]] = (float(speed), str(path))
    return rates


def split_metrics(metrics_csv: Path, out_dir: Path) -> dict[str, list[dict[str, float]]]:
    """Writes train.csv (step, tokens, loss, lr, grad norm, tokens/s) and val.csv (step, tokens, loss) from
    Lightning's metrics.csv; returns both as lists of rows."""
    with open(metrics_csv, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    train = [
        {"step": int(float(r["step"])), **{k: float(r[k]) for k in TRAIN_COLUMNS}}
        for r in rows
        if r.get("train/loss") not in (None, "")
    ]
    per_step = train[0]["train/tokens_seen"] / train[0]["step"] if train else 0
    val = [
        {"step": (s := int(float(r["step"]))), "tokens": int(s * per_step), "val/loss": float(r["val/loss"])}
        for r in rows
        if r.get("val/loss") not in (None, "")
    ]
    for name, table in (("train.csv", train), ("val.csv", val)):
        with open(out_dir / name, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(table[0]) if table else ["step"])
            writer.writeheader()
            writer.writerows(table)
    return {"train": train, "val": val}


def steady_rate(train_rows: list[dict[str, float]]) -> float:
    """Median tokens/s over the logging windows after the first (which holds compilation and warm-up)."""
    rates = [r["perf/tokens_per_s"] for r in train_rows[1:]] or [r["perf/tokens_per_s"] for r in train_rows]
    return statistics.median(rates)


def collect(spec: Spec, run_dir: Path) -> dict[str, Any]:
    """Writes the results folder of the cell whose run folder is `run_dir` and returns its run.json document.

    Raises (before anything is written):
        FileNotFoundError: the run folder lacks a file the results are made from (the cell did not finish).
        ValueError: one of its JSON files does not parse.
    """
    launch = read_json(run_dir / CELL_FILE)
    needed = [TIMING_FILE, VAL_FILE, "summary.json", "train.log", "csv/metrics.csv"]
    if not launch["sweep"]:
        needed.append(f"{ZERO_SHOT_DIR}/results.json")
    missing = [name for name in needed if not (run_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"run folder {run_dir} lacks {', '.join(missing)}: the cell did not finish")
    timing, summary, val = (read_json(run_dir / name) for name in (TIMING_FILE, "summary.json", VAL_FILE))
    out = cell_dir(spec, launch)
    out.mkdir(parents=True, exist_ok=True)
    curves = split_metrics(run_dir / "csv" / "metrics.csv", out)
    (out / "train.log").write_bytes((run_dir / "train.log").read_bytes()[-LOG_TAIL_BYTES:])
    if not launch["sweep"]:
        shutil.copyfile(run_dir / ZERO_SHOT_DIR / "results.json", out / "eval.json")
    rate, gpus = steady_rate(curves["train"]), launch["gpus"]
    eval_s = timing.get("validate", 0.0) + timing.get("zero_shot", 0.0)
    record = {
        **launch,
        "params": summary["params"],
        "steps": summary["steps"],
        "tokens": summary["tokens_seen"],
        "skipped_steps": summary["skipped_steps"],
        "final_train_loss": curves["train"][-1]["train/loss"],
        "val": val,
        "throughput": {"tokens_per_s": rate, "tokens_per_s_per_gpu": rate / gpus},
        "wall_s": timing,
        "gpu_minutes": {
            "train": timing["train"] * gpus / 60,
            "eval": eval_s / 60,
            "total": (timing["train"] * gpus + eval_s) / 60,
        },
    }
    write_atomic(out / RUN_FILE, json.dumps(record, indent=1) + "\n")
    return record


def collect_all(spec: Spec, work: Path) -> list[dict[str, Any]]:
    """`collect` for every finished run folder under `work` (sweep/ and runs/) whose results are missing."""
    records = []
    for run_dir in sorted([*work.glob("sweep/*"), *work.glob("runs/*")]):
        if (run_dir / TIMING_FILE).is_file() and (run_dir / CELL_FILE).is_file():
            launch = read_json(run_dir / CELL_FILE)
            if not (cell_dir(spec, launch) / RUN_FILE).is_file():
                records.append(collect(spec, run_dir))
    return records
