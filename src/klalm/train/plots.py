"""Loss curves from a run's metrics CSV (Lightning's CSVLogger layout: one `step` column, one column per metric)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from klalm.fileio import save_figure


def read_metric(csv_path: str | Path, name: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric column, skipping rows where it is empty."""
    steps, values = [], []
    with open(csv_path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row.get(name) not in (None, ""):
                steps.append(int(float(row["step"])))
                values.append(float(row[name]))
    return steps, values


def plot_losses(csv_paths: dict[str, Path], out_png: str | Path, *, title: str = "") -> Path:
    """Plots train loss (and validation loss where logged) of one or more runs against the optimiser step.

    Args:
        csv_paths: label → metrics.csv of a run.
        out_png: output image path.
        title: figure title.

    Raises:
        FileNotFoundError: a metrics file is missing.
        ValueError: no file has a train/loss value.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    try:
        plotted = 0
        for index, (label, path) in enumerate(csv_paths.items()):
            if not Path(path).is_file():
                raise FileNotFoundError(f"metrics file {path} does not exist")
            steps, losses = read_metric(path, "train/loss")
            finite = [(s, v) for s, v in zip(steps, losses) if math.isfinite(v)]
            colour = f"C{index % 10}"  # a run's train and validation curves in one colour
            if finite:
                ax.plot(*zip(*finite), color=colour, label=f"{label} train")
                plotted += 1
            val_steps, val_losses = read_metric(path, "val/loss")
            if val_steps:
                ax.plot(val_steps, val_losses, "o--", color=colour, label=f"{label} val")
        if not plotted:
            raise ValueError(f"no train/loss values in {sorted(map(str, csv_paths.values()))}")
        ax.set_xlabel("optimiser step")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        save_figure(fig, out_png, dpi=120)
    finally:
        plt.close(fig)
    return Path(out_png)
