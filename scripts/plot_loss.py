"""Plot the loss curves of one or more runs (train loss, and validation loss where logged) into one PNG.

    python scripts/plot_loss.py outputs/kla_45m/2026-11-29_14-00-00 outputs/gpt_45m/2026-11-29_15-00-00 \
        --out kla_vs_gpt.png
    python scripts/plot_loss.py outputs/multirun/2026-11-29_16-00-00/*_kla_45m --out lr_sweep.png

`--out` names the image and its format by its suffix (.png, or another format matplotlib writes: .pdf, .svg, ...); a
name without one (`--out foo`, once written as PNG bytes under that name) or with one matplotlib cannot write is
refused before any run is read. A run without a readable metrics file with a training loss, or an output it cannot
write, ends it with one line (`plot_loss: <why>`) and exit status 1.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from klalm.errors import one_line, refuse
from klalm.fileio import image_name_problem
from klalm.train.plots import plot_losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Plot loss curves of klalm runs (reads <run>/csv/metrics.csv).")
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    out_help = "output image, its format named by its suffix: .png (or .pdf, .svg, ...); a name without one is refused"
    parser.add_argument("--out", type=Path, default=Path("loss.png"), help=out_help)
    parser.add_argument("--title", default="", help="figure title")
    args = parser.parse_args(argv)
    why = image_name_problem(args.out)
    if why is not None:
        refuse("plot_loss", f"--out {args.out}: {why}")
    paths = {run.name if len(args.runs) == 1 else f"{run.parent.name}/{run.name}": run / "csv" / "metrics.csv"
             for run in args.runs}  # fmt: skip
    try:
        print(plot_losses(paths, args.out, title=args.title))
    except (OSError, ValueError, csv.Error) as err:  # a missing or damaged metrics file, no loss, an unwritable --out
        refuse("plot_loss", one_line(err))


if __name__ == "__main__":
    main()
