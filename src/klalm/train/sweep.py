"""Summary table across the runs of a sweep (a Hydra multirun), from each job's `summary.json`, and their loss curves.

Written automatically after every job of `klalm-train -m ...` by the Hydra callback `SweepSummary` (configs/hydra):
`summary.md` and `summary.png` in the sweep's folder. Available for any folder of runs:
    python -m klalm.train.sweep outputs/multirun/2026-11-29_14-00-00_3fa2c1 --plot curves.png

The same callback checks every job's config before the first job starts (`check_sweep_jobs`): a sweep whose grid holds
a job `klalm.config_checks` refuses, a job twice, or a fresh job whose folder already holds a run (a sweep re-run into
its earlier hydra.sweep.dir), is refused as a whole, in one line naming that job, before anything is written or trained.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import env_override
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from klalm.config_checks import (
    ConfigError,
    check_partial_targets,
    check_run_dir,
    check_train_config,
    missing_key_message,
    unknown_key_message,
)
from klalm.errors import one_line
from klalm.fileio import image_name_problem, write_atomic
from klalm.train.plots import plot_losses, read_metric
from klalm.train.rundir import RunDirTakenError, check_run_dir_free

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
    header = "| job | " + " | ".join(title for _, title, _ in COLUMNS) + " | overrides |"
    lines = [header, "|" + " --- |" * (len(COLUMNS) + 2)]
    for job, varied in _jobs(sweep_dir):
        summary_path = job / "summary.json"
        summary = _read_summary(summary_path) if summary_path.is_file() else None
        if summary is not None:
            cells = [_cell(summary.get(key), fmt) for key, _, fmt in COLUMNS]
        else:
            why = "unreadable summary.json" if summary_path.is_file() else "no summary.json (failed or unfinished)"
            cells = [why] + ["—"] * (len(COLUMNS) - 1)
        lines.append(f"| {job.name} | " + " | ".join(cells) + f" | {' '.join(varied)} |")
    return "\n".join(lines) + "\n"


def summary_plot(sweep_dir: str | Path, out_png: str | Path) -> Path | None:
    """Every job's loss curves (train, and validation where logged) in one plot, labelled with the job's folder and
    the overrides it varies; None (nothing written) while no job has logged a training loss."""
    curves = {}
    for job, varied in _jobs(sweep_dir):
        path = job / "csv" / "metrics.csv"
        try:
            if not path.is_file() or not read_metric(path, "train/loss")[0]:
                continue  # no training loss yet (a job that failed early, or is running)
        except (OSError, ValueError, csv.Error) as err:  # damaged: the other jobs are still plotted
            log.warning("sweep plot: %s left out: %s", path, one_line(err))
            continue
        curves[" ".join([job.name, *varied])] = path
    return plot_losses(curves, out_png, title=f"sweep {Path(sweep_dir).name}: loss") if curves else None


def _jobs(sweep_dir: str | Path) -> list[tuple[Path, list[str]]]:
    """The job folders under `sweep_dir` in name order, each with its overrides that not every job shares (what the
    sweep varied). Every job the sweep's `multirun.yaml` plans counts, not only those that have started: the rows of
    a sweep that ended after its first job named no override."""
    jobs = sorted(p for p in Path(sweep_dir).iterdir() if p.is_dir() and not p.name.startswith("."))
    overrides = {job: _overrides(job) for job in jobs}
    every = [*overrides.values(), *_planned_jobs(Path(sweep_dir))]
    shared = set.intersection(*(set(o) for o in every)) if every else set()
    return [(job, [o for o in overrides[job] if o not in shared]) for job in jobs]


def _planned_jobs(sweep_dir: Path) -> list[list[str]]:
    """The overrides of every job of the sweep that `sweep_dir/multirun.yaml` records; [] without one (a folder of
    single runs), or for a sweep `sweep_jobs` does not expand (another sweeper, a `glob()`)."""
    path = sweep_dir / "multirun.yaml"
    try:
        config = OmegaConf.load(path) if path.is_file() else None
        if config is None or OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER:
            return []
        params = OmegaConf.select(config, "hydra.sweeper.params")
        return sweep_jobs(list(config.hydra.overrides.task), dict(params) if params else None)
    except Exception as err:  # damaged, or a sweep the basic sweeper expands only with Hydra's config loader
        log.debug("sweep summary: %s not read (%s)", path, one_line(err))
        return []


def _overrides(job: Path) -> list[str]:
    """The job's overrides: its first start's record (`.hydra/`), or, for a job that first started with a `resume`
    (whose record is `.hydra/resume-<time>_<hex>/`, as in a sweep re-run with resume=auto), the oldest such record."""
    records = [job / ".hydra" / "overrides.yaml", *sorted((job / ".hydra").glob("resume-*/overrides.yaml"))]
    path = next((p for p in records if p.is_file()), None)
    if path is None:
        return []
    import yaml

    try:
        overrides = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as err:  # damaged: the job's row stays, without its overrides
        log.warning("sweep summary: %s not read: %s", path, one_line(err))
        return []
    return [str(o) for o in overrides] if isinstance(overrides, list) else []


def _read_summary(path: Path) -> dict[str, Any] | None:
    """A job's summary; None (logged) for one that does not parse (a job killed as it wrote it), so that its row says
    so and the other rows are still written."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        log.warning("sweep summary: %s not read: %s", path, one_line(err))
        return None
    if not isinstance(summary, dict):
        log.warning("sweep summary: %s not read: not a JSON object", path)
        return None
    return summary


# The `_target_` of Hydra's own sweeper (hydra/sweeper=basic), the one whose jobs `sweep_jobs` expands.
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_jobs(
    task_overrides: Sequence[str], params: Mapping[str, Any] | None = None, config_loader: Any = None
) -> list[list[str]]:
    """The overrides of each job of a multirun, as Hydra's basic sweeper expands them, in its order (the i-th list is
    job `hydra.job.num=i`): the cartesian product of the comma lists (`a=1,2 b=x,y` gives 4 jobs), with the sweeper's
    `params` (`hydra.sweeper.params`, as set by configs/sweep/*.yaml) before the command line's overrides, which win for
    a key both name. `config_loader` (Hydra's) serves `glob()` sweeps over config groups.

    Raises:
        hydra.errors.HydraException: a sweep the basic sweeper does not support (an interval).
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    arguments = [f"{key}={value}" for key, value in (params or {}).items()] + list(task_overrides)
    overrides = OverridesParser.create(config_loader=config_loader).parse_overrides(arguments)
    return [list(job) for batch in BasicSweeper.split_arguments(overrides, max_batch_size=None) for job in batch]


MULTIRUN_FLAGS = ("-m", "--multirun")


def unknown_sweep_key_message(arguments: list[str]) -> str | None:
    """For `klalm-train -m <overrides>` (no other flag), `unknown_key_message` of its first job: Hydra composes the
    sweep's own config from every override that sweeps nothing before any callback runs, so a key there that the
    config lacks (`-m optim.lr=1e-3,3e-3 model.d_modle=64`) ended the command in Hydra's six lines, before
    `check_sweep_jobs` (which refuses such a key in a later job's overrides) could name the nearest key. None for
    any other command line, or a sweep the basic sweeper's grammar does not expand here (a `glob()`)."""
    overrides = [a for a in arguments if a not in MULTIRUN_FLAGS]
    if len(overrides) == len(arguments) or any(a.startswith("-") for a in overrides):
        return None
    try:
        first = sweep_jobs(overrides)[0]
    except Exception:  # Hydra's to report
        return None
    return unknown_key_message("train", first)


def _varied(jobs: list[list[str]]) -> list[int]:
    """Positions of the overrides that differ between jobs (all positions when none does, as for a single job)."""
    varied = [i for i in range(len(jobs[0])) if len({job[i] for job in jobs}) > 1] if jobs else []
    return varied or list(range(len(jobs[0]) if jobs else 0))


@contextlib.contextmanager
def _as_job(cfg: DictConfig) -> Iterator[None]:
    """`HydraConfig` holds the job's Hydra config meanwhile (for `${hydra:...}` interpolations), as it does while
    `hydra.core.utils.run_job` names the job's folder and runs the job; what it held before is restored after (at
    `on_multirun_start`: nothing)."""
    hydra_config = HydraConfig.instance()
    saved = hydra_config.cfg
    hydra_config.set_config(cfg)
    try:
        yield
    finally:
        hydra_config.cfg = saved


def _job_config(config_loader: Any, master: DictConfig, overrides: list[str], num: int) -> DictConfig:
    """Job `num`'s config (with its `hydra` node) as Hydra's basic launcher composes it, and its output folder as
    `hydra.core.utils.run_job` names it (not created): with the job's config in `HydraConfig`, since the folder's name
    may interpolate it (`hydra.sweep.subdir=${hydra:job.override_dirname}`; the composed config already holds the
    job's `hydra.job.override_dirname`, `hydra.job.name` and `hydra.runtime.choices`)."""
    cfg = config_loader.load_sweep_config(master, list(overrides))
    with open_dict(cfg):
        cfg.hydra.job.id = num
        cfg.hydra.job.num = num
    with _as_job(cfg):
        output_dir = os.path.join(str(cfg.hydra.sweep.dir), str(cfg.hydra.sweep.subdir))
        with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
            cfg.hydra.runtime.output_dir = os.path.abspath(output_dir)
    return cfg


def _check_job(cfg: DictConfig) -> None:
    """`check_train_config` on the job's config as the job's task function will get it (without the `hydra` node),
    in the job's surroundings as `run_job` sets them up: `HydraConfig` holding the job's config, and the environment
    variables of `hydra.job.env_set` set (`${oc.env:...}` values, and `TRITON_INTERPRET`, which the checks read);
    both are restored after. Then, for a fresh job (resume=null), that its folder holds no run yet
    (`check_run_dir_free`, as `LockRunDir` checks a single run's folder): a sweep re-run into an earlier sweep's
    hydra.sweep.dir had Hydra rewrite `multirun.yaml` and the job's `.hydra/` over that run's config record before the
    job's own check refused it, and `summary.md` then labelled the old results with the new overrides. A job that
    resumes is left to its own check, which resolves the checkpoint it continues.

    Anything else on disk is left to each job's own check as it starts, since an earlier job of the sweep may create
    it (`resume=${hydra:sweep.dir}/0_smoke`): `check_paths=False` skips the existence of `resume`, the only check of
    `check_train_config` that looks at a file a run reads. Nothing else there needs such care: the known keys come
    from klalm's own configs/train.yaml, the data paths (`data.train`, `data.val`) are only type-checked and the
    tokenizer, the checkpoint folders and `paths.*` not at all; the job opens those files itself."""
    with _as_job(cfg), env_override(HydraConfig.get().job.env_set):
        task_cfg = copy.deepcopy(cfg)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        check_train_config(task_cfg, check_paths=False)
        check_run_dir(task_cfg, cfg.hydra.runtime.output_dir, sweep=True)
        if task_cfg.resume is None:
            check_run_dir_free(cfg.hydra.runtime.output_dir, None, sweep=True)


def check_sweep_jobs(config: DictConfig) -> None:
    """Before a multirun's first job: composes every job's config and runs `check_train_config` on each (nothing
    heavier than omegaconf is imported, unless a job's folder holds checkpoints), so that a grid holding a bad value
    is refused before any job trains. Once every job passed those, `check_partial_targets` refuses a target of the
    optimiser or the schedule that does not import and a key it takes no argument for (`+optim.llr=1e-3,3e-3`,
    which each job refused only as it started, after building its data and model), importing their targets (torch)
    as the jobs would. Each job is checked as `run_job` will run it: its folder named and `${hydra:...}` resolved
    from its own Hydra config, with its `hydra.job.env_set` in the environment; only what an earlier job may create
    on disk (a `resume` path) is left to the job's own check as it starts. A fresh job whose folder already holds a
    run is refused too (a re-run into an earlier sweep's hydra.sweep.dir): nothing of that sweep is overwritten.

    Only the basic sweeper's sweeps are expanded. Another sweeper plugin (optuna, nevergrad, ax: none is installed
    or configured by klalm today) chooses its jobs as it goes, so there is no grid to check: the check is skipped and
    each job is checked when it starts, as before. A sweep the basic sweeper cannot expand, or a job whose config
    cannot be composed (an unknown group option), is left to Hydra, which refuses either before any job runs; but a
    job that sets a key its config lacks (`optim.llr=1e-3,3e-3`) is refused here, in one line with the nearest key.

    Raises:
        SystemExit: a job's config, or its folder, was refused; the message names the job (its number, as in its
            folder's name `<num>_<run_name>`, and the overrides the jobs vary) and the error. Nothing was written: the
            sweeper makes the sweep's folder, and writes into it, later. With HYDRA_FULL_ERROR=1 the traceback is
            printed first.
    """
    global_hydra = GlobalHydra.instance()
    if OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER or not global_hydra.is_initialized():
        return  # another sweeper plugin: no grid to expand here; its jobs are checked as each starts
    config_loader = global_hydra.config_loader()
    try:
        task_overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        params = OmegaConf.select(config, "hydra.sweeper.params")
        jobs = sweep_jobs(task_overrides, dict(params) if params else None, config_loader)
    except Exception as err:  # the sweeper says why when it expands the same overrides
        log.debug("sweep: jobs not checked in advance (%s)", one_line(err))
        return
    shown = _varied(jobs)
    configs: list[DictConfig] = []
    nums: dict[tuple[str, ...], int] = {}
    for num, overrides in enumerate(jobs):
        earlier = nums.setdefault(tuple(overrides), num)
        if earlier != num:
            raise SystemExit(f"klalm-train: sweep jobs #{earlier} and #{num} are one job "
                             f"({' '.join(overrides[i] for i in shown)}): the grid gives a value twice (e.g. "
                             "optim.lr=1e-3,0.001), which would train it twice")  # fmt: skip
    for num, overrides in enumerate(jobs):
        try:
            cfg = _job_config(config_loader, config, overrides, num)
        except Exception as err:  # Hydra's own composition check of the batch refuses it before any job runs
            # (only what Hydra itself refuses gets here: `${hydra:...}` in the folder's name resolves, see _job_config)
            # but a key the config lacks in six lines, after writing the sweep's multirun.yaml: refused here in one
            message = missing_key_message("train", overrides, lambda o: config_loader.load_sweep_config(config, o))
            if message is not None:
                _refuse_sweep(num, [overrides[i] for i in shown], ConfigError(message))
            log.debug("sweep: job #%d not checked in advance (%s)", num, one_line(err))
            return
        try:
            _check_job(cfg)
        except (ConfigError, RunDirTakenError) as err:
            _refuse_sweep(num, [overrides[i] for i in shown], err)
        configs.append(cfg)
    for num, (overrides, cfg) in enumerate(zip(jobs, configs, strict=True)):  # once the light checks passed: imports
        try:  # the targets (torch), which the jobs import anyway
            check_partial_targets(cfg)
        except ConfigError as err:
            _refuse_sweep(num, [overrides[i] for i in shown], err)
    log.debug("sweep: the configs of %d jobs passed the checks", len(jobs))


def _refuse_sweep(num: int, overrides: list[str], err: ConfigError | RunDirTakenError) -> NoReturn:
    """Ends the sweep with one line on stderr (HYDRA_FULL_ERROR=1: the traceback before it). A SystemExit, because
    Hydra turns any Exception a callback raises into a warning and carries on."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        traceback.print_exception(err)
    job = f"sweep job #{num}" + (f" ({' '.join(overrides)})" if overrides else "")
    raise SystemExit(f"klalm-train: {job}: {one_line(err)}")


class SweepSummary(Callback):
    """Hydra callback: checks every job's config before the first one starts (`check_sweep_jobs`), writes
    `<sweep dir>/summary.md` and `summary.png` after every job of a multirun and logs the table at the end.

    After every job, because Hydra ends a sweep in which a job failed by raising that job's error once the batch has
    run, and then never reaches `on_multirun_end`: the table, whose failed rows say so, is there anyway.
    """

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        check_sweep_jobs(config)

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN and Path(config.hydra.sweep.dir).is_dir():
            _write_summary(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        table = _write_summary(sweep_dir)
        log.info("sweep summary (%s, curves in summary.png):\n%s", sweep_dir / "summary.md", table)


def _write_summary(sweep_dir: Path) -> str:
    """Writes `summary.md` (the table, returned) and `summary.png` (every job's loss curves) into `sweep_dir`."""
    table = summary_table(sweep_dir)
    write_atomic(sweep_dir / "summary.md", table)
    summary_plot(sweep_dir, sweep_dir / "summary.png")
    return table


def main(argv: list[str] | None = None) -> None:
    """`python -m klalm.train.sweep DIR [--plot PNG]`: prints the summary table of the runs under DIR (and plots
    their loss curves)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m klalm.train.sweep", description=main.__doc__.split(": ", 1)[1])
    parser.add_argument("sweep_dir", type=Path, help="a folder of run folders, e.g. outputs/multirun/<time>_<hex>")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also write every run's loss curves into PNG")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        parser.error(f"{args.sweep_dir} is not a folder")
    if args.plot is not None and (why := image_name_problem(args.plot)) is not None:  # before the table, not after
        parser.error(f"--plot {args.plot}: {why}")
    print(summary_table(args.sweep_dir), end="")
    if args.plot is not None and summary_plot(args.sweep_dir, args.plot) is None:
        sys.exit(f"no run under {args.sweep_dir} has logged a training loss (csv/metrics.csv): nothing plotted")


if __name__ == "__main__":
    main()
