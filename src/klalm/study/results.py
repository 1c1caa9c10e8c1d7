"""The study's committed results folder: what one finished run leaves, and how it is read back.

    <results>/sweep/<model>-lr<lr>/   run.json, train.csv, val.csv, train.log
    <results>/runs/<model>-s<seed>/   run.json, train.csv, val.csv, train.log, eval.json (klalm-eval's results.json)

run.json holds the cell, the exact command, every override, the measured throughput and GPU time, the whole-shard
validation loss, the zero-shot summary (runs), the data actually trained on and the software versions. A cell
counts as done when its run.json exists, so a re-run of the runner skips it.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

from klalm.study.spec import Cell, Spec

RUN_FILE = "run.json"
TRAIN_COLUMNS = ("train/loss", "train/lr", "train/grad_norm", "train/tokens_seen", "perf/tokens_per_s")


def cell_dir(spec: Spec, cell: Cell) -> Path:
    return spec.results / ("sweep" if cell.sweep else "runs") / cell.name


def load_run(spec: Spec, cell: Cell) -> dict[str, Any] | None:
    """The run.json of a finished cell, or None."""
    path = cell_dir(spec, cell) / RUN_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def finished(spec: Spec, sweep: bool) -> list[dict[str, Any]]:
    """run.json of every finished cell of the sweep or of the runs, in folder order."""
    folder = spec.results / ("sweep" if sweep else "runs")
    return [json.loads(p.read_text()) for p in sorted(folder.glob(f"*/{RUN_FILE}"))]


def best_lr(spec: Spec, model: str) -> float | None:
    """The swept learning rate with the lowest whole-shard validation loss, once every lr of the sweep has run."""
    rows = [r for r in finished(spec, sweep=True) if r["model"] == model]
    if {r["lr"] for r in rows} != {float(lr) for lr in spec.sweep["lrs"]}:
        return None
    return min(rows, key=lambda r: r["val"]["loss"])["lr"]


def tokens_per_s_per_gpu(spec: Spec, model: str) -> tuple[float, str]:
    """This study's measured training rate of a model (tokens/s per GPU) and where it came from."""
    rows = [r for r in [*finished(spec, sweep=False), *finished(spec, sweep=True)] if r["model"] == model]
    if rows:
        return rows[0]["throughput"]["tokens_per_s_per_gpu"], f"measured ({rows[0]['cell']})"
    return float(spec.estimate["prior_tokens_per_s"][model]), "prior (docs/benchmarks.md)"


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
    tokens_per_step = train[0]["train/tokens_seen"] / train[0]["step"] if train else 0
    val = [
        {"step": int(float(r["step"])), "tokens": int(float(r["step"]) * tokens_per_step), "val/loss": float(r["val/loss"])}
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
