"""Summary table across the runs of a sweep (a Hydra multirun), from each job's `summary.json`.

Written automatically at the end of `klalm-train -m ...` by the Hydra callback `SweepSummary` (configs/hydra), and
available for any folder of runs:  python -m klalm.train.sweep outputs/multirun/2026-11-29_14-00-00
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

log = logging.getLogger(__name__)

# Columns of the table: (summary.json key, header, format).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run_name", "run", "{}"),
    ("params", "params", "{:,}"),
    ("steps", "steps", "{}"),
    ("tokens_seen", "tokens", "{:,}"),
    ("train/loss", "train loss", "{:.4f}"),
    ("val_loss", "val loss", "{:.4f}"),
    ("val_ppl", "val ppl", "{:.2f}"),
    ("perf/tokens_per_s", "tokens/s", "{:,.0f}"),
    ("perf/mfu", "MFU", "{:.1%}"),
    ("wall_s", "wall s", "{}"),
)


def _cell(value: Any, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


def summary_table(sweep_dir: str | Path) -> str:
    """A Markdown table with one row per `*/summary.json` under `sweep_dir` (job folders in name order).

    The last column lists each job's overrides that not every job shares (what the sweep varied). Jobs without a
    summary (failed or still running) get a row saying so, so a sweep's failures stay visible.
    """
    sweep_dir = Path(sweep_dir)
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    overrides = {job: _overrides(job) for job in jobs}
    shared = set.intersection(*(set(o) for o in overrides.values())) if jobs else set()
    header = "| job | " + " | ".join(title for _, title, _ in COLUMNS) + " | overrides |"
    lines = [header, "|" + " --- |" * (len(COLUMNS) + 2)]
    for job in jobs:
        summary_path = job / "summary.json"
        if summary_path.is_file():
            summary = json.loads(summary_path.read_text())
            cells = [_cell(summary.get(key), fmt) for key, _, fmt in COLUMNS]
        else:
            cells = ["no summary.json (failed or unfinished)"] + ["—"] * (len(COLUMNS) - 1)
        varied = " ".join(o for o in overrides[job] if o not in shared)
        lines.append(f"| {job.name} | " + " | ".join(cells) + f" | {varied} |")
    return "\n".join(lines) + "\n"


def _overrides(job: Path) -> list[str]:
    path = job / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    import yaml

    return list(yaml.safe_load(path.read_text()) or [])


class SweepSummary(Callback):
    """Hydra callback: writes `<sweep dir>/summary.md` after every job of a multirun and logs it at the end.

    After every job, because Hydra ends a sweep in which a job failed by raising that job's error once the batch has
    run, and then never reaches `on_multirun_end`: the table, whose failed rows say so, is there anyway.
    """

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN and Path(config.hydra.sweep.dir).is_dir():
            (Path(config.hydra.sweep.dir) / "summary.md").write_text(summary_table(Path(config.hydra.sweep.dir)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        table = summary_table(sweep_dir)
        (sweep_dir / "summary.md").write_text(table)
        log.info("sweep summary (%s):\n%s", sweep_dir / "summary.md", table)


def main(argv: list[str] | None = None) -> None:
    """`python -m klalm.train.sweep DIR`: prints the summary table of the runs under DIR."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        raise SystemExit("usage: python -m klalm.train.sweep <sweep dir>")
    print(summary_table(args[0]), end="")


if __name__ == "__main__":
    main()
