"""Sweeps: a Hydra multirun gives each job its own run dir and ends with a summary table across the jobs."""

import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from klalm.config_checks import ConfigError, check_train_config
from klalm.train.sweep import (
    BASIC_SWEEPER,
    _job_config,
    check_sweep_jobs,
    main,
    summary_plot,
    summary_table,
    sweep_jobs,
    unknown_sweep_key_message,
)

from .conftest import RUN_ENV, TINY, compose_train

# TINY at its cheapest: one optimiser step, no evaluation, export or plot.
ONE_STEP = [*TINY, "train.global_batch_tokens=32", "train.max_tokens=32", "train.final_eval=false",
            "train.export_hf=false", "train.plot=false"]  # fmt: skip


def _fake_job(folder, summary, overrides):
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))


def test_summary_table_has_one_row_per_job_and_shows_failures(tmp_path):
    ok = {"run_name": "a", "params": 1234, "steps": 10, "tokens_seen": 640, "train/loss": 3.5, "val_loss": 3.25,
          "val_ppl": 25.79, "perf/tokens_per_s": 1000.0, "wall_s": 4.2}  # fmt: skip
    _fake_job(tmp_path / "0_a", ok, ["experiment=x", "optim.lr=1e-3"])
    _fake_job(tmp_path / "1_a", None, ["experiment=x", "optim.lr=3e-3"])
    lines = summary_table(tmp_path).splitlines()
    assert len(lines) == 4  # header, separator, two jobs
    assert lines[2] == "| 0_a | a | 1,234 | 10 | 640 | 3.5000 | 3.2500 | 25.79 | 1,000 | — | 4.2 | optim.lr=1e-3 |"
    assert lines[3].startswith("| 1_a | no summary.json") and lines[3].endswith("optim.lr=3e-3 |")


def test_summary_labels_the_jobs_of_an_unfinished_or_resumed_sweep_and_survives_a_damaged_summary(tmp_path):
    """The sweep's multirun.yaml plans the jobs: a sweep that ended after its first job labelled that job with no
    override. A job first started by a re-run with resume=auto has its record in .hydra/resume-*/ only: its row had
    no label, and every other row all their overrides. A summary.json that does not parse ended the table (the
    callback's summary.md stayed as it was) in a traceback."""
    multirun = {"hydra": {"sweeper": {"_target_": BASIC_SWEEPER, "params": {"optim.lr": "1e-3,3e-3,1e-2"}},
                          "overrides": {"task": ["experiment=x", "seed=1"]}}}  # fmt: skip
    OmegaConf.save(multirun, tmp_path / "multirun.yaml")
    ok = {"run_name": "x", "steps": 4}
    _fake_job(tmp_path / "0_x", ok, ["optim.lr=0.001", "experiment=x", "seed=1"])
    rows = summary_table(tmp_path).splitlines()[2:]
    assert [row.split(" | ")[-1] for row in rows] == ["optim.lr=0.001 |"]
    _fake_job(tmp_path / "1_x", ok, [])
    (tmp_path / "1_x" / ".hydra" / "overrides.yaml").unlink()  # a job first started by a resume=auto re-run
    for stamp, extra in (("2026-12-01_10-00-00_aaaaaa", []), ("2026-12-02_10-00-00_bbbbbb", ["train.plot=false"])):
        record = tmp_path / "1_x" / ".hydra" / f"resume-{stamp}"
        record.mkdir()
        (record / "overrides.yaml").write_text(
            "".join(f"- {o}\n" for o in ["optim.lr=0.003", "experiment=x", "seed=1", "resume=auto", *extra])
        )
    _fake_job(tmp_path / "2_x", None, ["optim.lr=0.01", "experiment=x", "seed=1"])
    (tmp_path / "2_x" / "summary.json").write_text('{"steps": 4')  # killed as it wrote
    rows = summary_table(tmp_path).splitlines()[2:]
    assert [row.split(" | ")[-1] for row in rows] == ["optim.lr=0.001 |", "optim.lr=0.003 resume=auto |",
                                                      "optim.lr=0.01 |"]  # fmt: skip
    assert rows[0].startswith("| 0_x | x | — | 4 |") and rows[2].startswith("| 2_x | unreadable summary.json | — |")


@pytest.mark.slow
def test_summary_plot_draws_the_jobs_that_logged_a_loss_labelled_by_what_they_vary(tmp_path, monkeypatch, capsys):
    drawn = {}

    def plot_losses(curves, out_png, *, title):
        drawn.update(curves)
        Path(out_png).write_bytes(b"png")
        return Path(out_png)

    for name, lr, rows in (("0_a", "1e-3", "step,train/loss\n1,3.5\n"), ("1_a", "3e-3", None)):
        _fake_job(tmp_path / "runs" / name, None, ["experiment=x", f"optim.lr={lr}"])
        if rows is not None:
            (tmp_path / "runs" / name / "csv").mkdir()
            (tmp_path / "runs" / name / "csv" / "metrics.csv").write_text(rows)
    assert summary_plot(tmp_path / "runs", tmp_path / "real.png") == tmp_path / "real.png"  # the real plot
    assert (tmp_path / "real.png").read_bytes().startswith(b"\x89PNG")
    monkeypatch.setattr("klalm.train.sweep.plot_losses", plot_losses)
    main([str(tmp_path / "runs"), "--plot", str(tmp_path / "curves.png")])
    assert drawn == {"0_a optim.lr=1e-3": tmp_path / "runs" / "0_a" / "csv" / "metrics.csv"}
    assert "| 1_a | no summary.json" in capsys.readouterr().out and (tmp_path / "curves.png").is_file()


def test_a_damaged_metrics_file_leaves_its_job_out_of_the_plot_not_the_others(tmp_path, caplog):
    for name, rows in (("0_a", "step,train/loss\n1,3.5\n"), ("1_a", "step,train/loss\n0,x\n"), ("2_a", b"\xff\xfe")):
        _fake_job(tmp_path / "runs" / name, None, [f"seed={name[0]}"])
        (tmp_path / "runs" / name / "csv").mkdir()
        write = (tmp_path / "runs" / name / "csv" / "metrics.csv").write_bytes
        write(rows if isinstance(rows, bytes) else rows.encode())
    with caplog.at_level(logging.WARNING):
        assert summary_plot(tmp_path / "runs", tmp_path / "curves.png") == tmp_path / "curves.png"
    assert [r.getMessage().split(" left out")[0] for r in caplog.records] == [
        f"sweep plot: {tmp_path / 'runs' / name / 'csv' / 'metrics.csv'}" for name in ("1_a", "2_a")
    ]


def test_summary_plot_writes_nothing_before_any_loss_and_the_command_says_so(tmp_path):
    _fake_job(tmp_path / "runs" / "0_a", None, ["optim.lr=1e-3"])
    assert summary_plot(tmp_path / "runs", tmp_path / "curves.png") is None and not (tmp_path / "curves.png").exists()
    with pytest.raises(SystemExit, match="no run under .* has logged a training loss"):
        main([str(tmp_path / "runs"), "--plot", str(tmp_path / "curves.png")])


@pytest.mark.parametrize(("name", "why"), [("curves", "no suffix names the image's format"),
                                           ("curves.xyz", "matplotlib cannot write .xyz files")])  # fmt: skip
def test_a_plot_name_that_names_no_image_format_is_refused_before_the_table(tmp_path, capsys, name, why):
    """`--plot curves` wrote PNG bytes to a file named `curves`, and `--plot curves.xyz` ended in matplotlib's
    traceback after the table (scripts/plot_loss.py's --out is checked so: `image_name_problem`)."""
    _fake_job(tmp_path / "runs" / "0_a", None, ["optim.lr=1e-3"])
    (tmp_path / "runs" / "0_a" / "csv").mkdir()
    (tmp_path / "runs" / "0_a" / "csv" / "metrics.csv").write_text("step,train/loss\n1,3.5\n")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "runs"), "--plot", str(tmp_path / name)])
    out, err = capsys.readouterr()
    assert out == "" and f"error: --plot {tmp_path / name}: {why}; name it e.g. {tmp_path / 'curves.png'} (" in err
    assert not (tmp_path / name).exists()


def test_two_config_multirun_writes_job_dirs_and_summary(tmp_path):
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "klalm.train", "-m", *TINY, "optim.lr=0.001,0.003", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(cmd, env=RUN_ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name for p in jobs] == ["0_bench", "1_bench"]
    for job, lr in zip(jobs, ("0.001", "0.003")):
        assert json.loads((job / "summary.json").read_text())["steps"] == 4
        assert (job / "csv" / "metrics.csv").is_file()
        assert f"optim.lr={lr}" in (job / ".hydra" / "overrides.yaml").read_text()
    table = (sweep_dir / "summary.md").read_text().splitlines()
    assert len(table) == 4 and table[2].endswith("| optim.lr=0.001 |") and table[3].endswith("| optim.lr=0.003 |")
    assert (sweep_dir / "summary.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_a_refused_job_fails_alone_and_the_summary_shows_it(tmp_path):
    """In a sweep a refused job (here its token budget) fails as any failing job does, the next job still runs, and
    summary.md, written after every job, has both rows although Hydra ends such a sweep by raising."""
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "klalm.train", "-m", *TINY, "train.global_batch_tokens=100,64",
           f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    proc = subprocess.run(cmd, env=RUN_ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert (
        "refused: train.global_batch_tokens=100 is not a multiple" in (sweep_dir / "0_bench" / "train.log").read_text()
    )
    assert json.loads((sweep_dir / "1_bench" / "summary.json").read_text())["steps"] == 4
    table = (sweep_dir / "summary.md").read_text().splitlines()
    assert table[2].startswith("| 0_bench | no summary.json") and table[3].startswith("| 1_bench | bench |")


def test_sweep_jobs_expand_the_grid_as_hydras_basic_sweeper_does():
    assert sweep_jobs(["a=1,2", "b=x,y", "c=z"]) == [
        ["a=1", "b=x", "c=z"], ["a=1", "b=y", "c=z"], ["a=2", "b=x", "c=z"], ["a=2", "b=y", "c=z"],
    ]  # fmt: skip
    # hydra.sweeper.params (configs/sweep/*.yaml) come first; the command line wins for a key both set.
    assert sweep_jobs(["experiment=smoke", "optim.lr=0.001,0.003"], {"optim.lr": "0.1,0.2,0.3", "seed": "1,2"}) == [
        ["optim.lr=0.001", "seed=1", "experiment=smoke"], ["optim.lr=0.001", "seed=2", "experiment=smoke"],
        ["optim.lr=0.003", "seed=1", "experiment=smoke"], ["optim.lr=0.003", "seed=2", "experiment=smoke"],
    ]  # fmt: skip
    assert sweep_jobs([]) == [[]]  # `-m` alone: one job


@contextlib.contextmanager
def _multirun_config(overrides):
    """The multirun config of `klalm-train -m <overrides>`, with Hydra initialised as in a callback."""
    with initialize_config_module("klalm.configs", version_base="1.3"):
        yield GlobalHydra.instance().hydra.compose_config("train", overrides, run_mode=RunMode.MULTIRUN)


def test_check_sweep_jobs_refuses_a_grid_with_one_bad_job_naming_it(monkeypatch, capsys):
    with _multirun_config(["experiment=smoke", "sweep=lr", "data.batch_size=2,0"]) as config:
        saved = HydraConfig.instance().cfg
        with pytest.raises(SystemExit) as exit_info:
            check_sweep_jobs(config)
        assert HydraConfig.instance().cfg is saved  # the jobs' Hydra config was only lent to the check
        assert exit_info.value.code == (
            "klalm-train: sweep job #1 (optim.lr=0.0003 data.batch_size=0): data.batch_size=0 is invalid: must be > 0"
        )  # jobs: 3 learning rates (configs/sweep/lr.yaml) x 2 batch sizes; the first bad one is named
        assert capsys.readouterr().err == ""
        monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
        with pytest.raises(SystemExit):
            check_sweep_jobs(config)
        err = capsys.readouterr().err
        assert err.startswith("Traceback") and "ConfigError: data.batch_size=0 is invalid" in err
    with _multirun_config(["experiment=smoke", "optim.lr=1e-3,3e-3", "run_name=lr_${optim.lr}_${hydra:job.num}"]) as ok:
        check_sweep_jobs(ok)  # a good grid passes (an interpolation of the job's Hydra config included)
    with _multirun_config(["experiment=smoke", "optim.lr=abc", "hydra.sweeper._target_=some.OtherSweeper"]) as other:
        check_sweep_jobs(other)  # another sweeper plugin picks its jobs itself: each is checked as it starts


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (["scheduler.warmup=5,20"], "sweep job #1 (scheduler.warmup=20): scheduler.warmup=20 gives 20 warmup steps, "
         "not fewer than the run's 20 (train.max_tokens // train.global_batch_tokens): its lr would never reach "
         "optim.lr"),
        (["scheduler.warmup=8", "train.max_tokens=10240,4096"], "sweep job #1 (train.max_tokens=4096): "
         "scheduler.warmup=8 gives 8 warmup steps, not fewer than the run's 8 (train.max_tokens // "
         "train.global_batch_tokens): its lr would never reach optim.lr"),
        (["train.max_tokens=10240,100"], "sweep job #1 (train.max_tokens=100): train.max_tokens=100 is smaller than "
         "one global batch (train.global_batch_tokens=512): the run would take no step"),
    ],
    ids=["warmup", "warmup-of-a-shorter-run", "no-step"],
)  # fmt: skip
def test_check_sweep_jobs_refuses_a_job_whose_warmup_outlasts_its_run(overrides, refusal):
    """A single run refuses a warmup of at least its steps (or a budget of no step) from its config: so does a
    sweep, before its job #0 trains (job #1 failed only as it started, in Hydra's traceback)."""
    with _multirun_config(["experiment=smoke", *overrides]) as config, pytest.raises(SystemExit) as exit_info:
        check_sweep_jobs(config)
    assert exit_info.value.code == f"klalm-train: {refusal}"


def test_check_sweep_jobs_refuses_a_grid_that_holds_a_job_twice():
    """`optim.lr=1e-3,3e-3,0.001` trained lr=0.001 twice, and summary.md's rows of both said the same."""
    grid = ["experiment=smoke", "optim.lr=1e-3,3e-3,0.001"]
    with _multirun_config(grid) as config, pytest.raises(SystemExit) as exit_info:
        check_sweep_jobs(config)
    assert exit_info.value.code == (
        "klalm-train: sweep jobs #0 and #2 are one job (optim.lr=0.001): the grid gives a value twice (e.g. "
        "optim.lr=1e-3,0.001), which would train it twice"
    )
    with _multirun_config(["experiment=smoke", "seed=1,1"]) as config, pytest.raises(SystemExit) as exit_info:
        check_sweep_jobs(config)
    assert exit_info.value.code.startswith("klalm-train: sweep jobs #0 and #1 are one job (experiment=smoke seed=1):")


def test_check_sweep_jobs_refuses_a_key_the_optimiser_or_schedule_takes_no_argument_for():
    """`+optim.llr=1e-3,3e-3` passed the check, then each job refused it with a traceback as it started, after
    building its data and model; a single run refuses it in one line (tests/test_cli.py, "optim-argument")."""
    with (
        _multirun_config(["experiment=smoke", "+optim.llr=1e-3,3e-3"]) as config,
        pytest.raises(SystemExit) as exit_info,
    ):
        check_sweep_jobs(config)
    assert exit_info.value.code == (
        "klalm-train: sweep job #0 (+optim.llr=0.001): optim.llr is not an argument of torch.optim.AdamW (did you "
        "mean optim.lr?)"
    )
    grid = ["experiment=smoke", "seed=1,2", "+scheduler.decay_frac=0.2"]  # (a WSD key under the cosine schedule)
    with _multirun_config(grid) as config, pytest.raises(SystemExit) as exit_info:
        check_sweep_jobs(config)
    assert exit_info.value.code.startswith(
        "klalm-train: sweep job #0 (seed=1): scheduler.decay_frac is not an argument of klalm.train.optim.warmup_cosine"
    )


def _checked_in_advance(config, caplog):
    """`check_sweep_jobs(config)` passes, and did check every job (it did not step aside, as for a config it cannot
    compose, which it logs at debug level)."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="klalm.train.sweep"):
        check_sweep_jobs(config)
    assert [r.getMessage() for r in caplog.records if r.name == "klalm.train.sweep"] == [
        "sweep: the configs of 2 jobs passed the checks"
    ]


def test_check_sweep_jobs_sets_each_jobs_env_set_meanwhile(monkeypatch, caplog):
    """`hydra.job.env_set` is in the environment while the job runs (`run_job`), so also while it is checked."""
    monkeypatch.delenv("CORPUS", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # (tests/conftest.py sets it for the kernel tests)
    env_set = ["data=files", "data.train=${oc.env:CORPUS}", "+hydra.job.env_set.CORPUS=/x/c.jsonl"]
    with _multirun_config([*env_set, "optim.lr=1e-3,2e-3"]) as config:
        _checked_in_advance(config, caplog)
        assert "CORPUS" not in os.environ  # restored after
    with _multirun_config([*env_set, "data.batch_size=2,0"]) as config, pytest.raises(SystemExit) as exit_info:
        check_sweep_jobs(config)  # and the jobs are still checked
    assert (
        exit_info.value.code
        == "klalm-train: sweep job #1 (data.batch_size=0): data.batch_size=0 is invalid: must be > 0"
    )
    triton = ["model.mixer_options.kla.backend=triton", "trainer=cpu", "optim.lr=1e-3,2e-3"]
    with _multirun_config(["+hydra.job.env_set.TRITON_INTERPRET=1", *triton]) as config:
        _checked_in_advance(config, caplog)  # config_checks reads $TRITON_INTERPRET
        assert "TRITON_INTERPRET" not in os.environ
    with _multirun_config(triton) as config, pytest.raises(SystemExit, match="backend=triton needs a CUDA GPU"):
        check_sweep_jobs(config)


def test_check_sweep_jobs_leaves_a_resume_path_an_earlier_job_creates_to_the_job(caplog):
    """Job #1 resumes job #0's run folder, which does not exist before the sweep: its existence is checked as job #1
    starts (a single run's check still refuses a missing path: tests/test_cli.py), but its type still up front."""
    with _multirun_config(["experiment=smoke", "resume=null,${hydra:sweep.dir}/0_smoke"]) as config:
        _checked_in_advance(config, caplog)
    with _multirun_config(["experiment=smoke", "resume=null,5"]) as config, pytest.raises(SystemExit) as exit_info:
        check_sweep_jobs(config)
    assert exit_info.value.code == "klalm-train: sweep job #1 (resume=5): resume=5 is invalid: must be a string"
    with pytest.raises(ConfigError, match="resume='/no/such/run': no such checkpoint file or run directory"):
        check_train_config(compose_train(["experiment=smoke", "resume=/no/such/run"]))  # a single run's: checked


def test_a_sweep_jobs_resume_auto_continues_its_own_folder_never_a_single_run(tmp_path, caplog):
    """resume=auto in a sweep's job looked past its own folder into the single runs of its run_name
    (paths.resume_glob): a sweep re-run whose job had no checkpoint yet (or any sweep started with resume=auto, in a
    new hydra.sweep.dir) resumed another run, here a finished single run, so the job trained nothing."""
    from klalm.train.app import run
    from klalm.train.sweep import _as_job

    out, sweep = tmp_path / "out", tmp_path / "sweep"
    with_checkpoints = [*ONE_STEP, "callbacks=default", "callbacks.sampler=null", "callbacks.progress=null"]
    run(compose_train(with_checkpoints, out / "bench" / "single"))  # a run of the jobs' run_name, with a checkpoint
    overrides = [*with_checkpoints, "resume=auto", f"paths.log_dir={out}", f"hydra.sweep.dir={sweep}"]
    with _multirun_config([*overrides, "hydra.mode=MULTIRUN"]) as config:  # (the override `-m` adds)
        job = _job_config(GlobalHydra.instance().config_loader(), config, overrides, 0)
        task = OmegaConf.masked_copy(job, [key for key in job if key != "hydra"])
        with _as_job(job), caplog.at_level(logging.INFO, logger="klalm.train.resume"):
            run(task)
    assert "resume=auto (this run's folder): no valid checkpoint, starting fresh" in caplog.messages
    assert [p.name for p in (sweep / "0_bench" / "checkpoints").glob("*.ckpt")] == ["step-00000001.ckpt"]


def test_check_sweep_jobs_names_job_folders_from_the_jobs_hydra_config(caplog):
    """`hydra.sweep.subdir=${hydra:job.override_dirname}` resolves with the job's config in HydraConfig, as in
    `run_job`: the check neither steps aside nor lets a bad job through."""
    subdir = "hydra.sweep.subdir=${hydra:job.override_dirname}"
    with _multirun_config(["experiment=smoke", subdir, "data.batch_size=2,4"]) as config:
        assert HydraConfig.instance().cfg is None  # as at on_multirun_start
        _checked_in_advance(config, caplog)
        assert HydraConfig.instance().cfg is None
        cfg = _job_config(GlobalHydra.instance().config_loader(), config, ["experiment=smoke", "data.batch_size=4"], 1)
        assert cfg.hydra.runtime.output_dir == os.path.abspath(
            os.path.join(cfg.hydra.sweep.dir, "data.batch_size=4,experiment=smoke")
        )
    with (
        _multirun_config(["experiment=smoke", subdir, "data.batch_size=2,0"]) as config,
        pytest.raises(SystemExit) as exit_info,
    ):
        check_sweep_jobs(config)
    assert (
        exit_info.value.code
        == "klalm-train: sweep job #1 (data.batch_size=0): data.batch_size=0 is invalid: must be > 0"
    )


def _fresh_python_train(argv, cwd):
    """`klalm-train <argv>` in a new interpreter; prints HEAVY if torch or Lightning got imported, else LIGHT."""
    code = textwrap.dedent(f"""
        import sys
        sys.argv = {["klalm-train", *argv]!r}
        from klalm import cli
        try:
            cli.train()
        finally:
            print("HEAVY" if "torch" in sys.modules or "lightning" in sys.modules else "LIGHT")
    """)
    return subprocess.run([sys.executable, "-c", code], env=RUN_ENV, capture_output=True, text=True, cwd=cwd,
                          timeout=300)  # fmt: skip


def test_a_sweep_with_one_bad_job_is_refused_before_any_job_trains(tmp_path):
    """The good first job does not run (torch is never imported), and no sweep folder is left behind."""
    proc = _fresh_python_train(["-m", *ONE_STEP, "optim.lr=1e-3,abc", f"paths.log_dir={tmp_path / 'out'}"], tmp_path)
    assert proc.returncode == 1
    refusal = "klalm-train: sweep job #1 (optim.lr=abc): optim.lr='abc' is invalid: must be a finite number"
    assert proc.stderr.strip() == refusal
    assert proc.stdout.strip() == "LIGHT"
    assert list(tmp_path.iterdir()) == []  # no outputs/multirun/<name>/, no job folder, summary or checkpoint


def test_a_sweep_key_the_config_lacks_is_refused_in_one_line_naming_the_nearest(tmp_path):
    """As for a single run (tests/test_cli.py): Hydra said it in six lines, and where the key swept, after writing
    the sweep's folder and multirun.yaml. A key set alongside the sweep stops Hydra before any callback runs, so the
    command line's first job is checked before Hydra starts; a key only a later job's config lacks, by the sweep's
    check of every job."""
    assert unknown_sweep_key_message(["-m", "experiment=smoke", "optim.lr=1e-3,3e-3", "model.d_modle=64"]) == (
        "model.d_modle=64: model has no key 'd_modle' (did you mean model.d_model?); `klalm-train --help` lists the "
        "keys"
    )
    assert unknown_sweep_key_message(["--multirun", "optim.llr=1e-3,3e-3"]).startswith(
        "optim.llr=0.001: optim has no key 'llr' (did you mean optim.lr?)"
    )
    for arguments in (["optim.llr=1e-3"], ["-m", "--cfg", "job", "optim.llr=1e-3,3e-3"], ["-m", "optim.lr=1e-3,3e-3"]):
        assert unknown_sweep_key_message(arguments) is None  # not a sweep, other flags (Hydra's), or no unknown key
    grid = ["experiment=smoke", "model=kla_tiny,gpt_tiny", "model.mixer_options.kla.d_state=4"]
    with _multirun_config(grid) as config, pytest.raises(SystemExit) as exit_info:
        check_sweep_jobs(config)
    assert exit_info.value.code == (
        "klalm-train: sweep job #1 (model=gpt_tiny): model.mixer_options.kla.d_state=4: model.mixer_options has no key "
        "'kla'; `klalm-train --help` lists the keys"
    )
    proc = _fresh_python_train(["-m", *ONE_STEP, "optim.llr=1e-3,3e-3", f"paths.log_dir={tmp_path / 'out'}"], tmp_path)
    assert proc.returncode == 1 and proc.stdout.strip() == "LIGHT"
    assert proc.stderr.strip() == (
        "klalm-train: optim.llr=0.001: optim has no key 'llr' (did you mean optim.lr?); `klalm-train --help` lists the "
        "keys"
    )
    assert list(tmp_path.iterdir()) == []  # no outputs/multirun/<name>/multirun.yaml


def test_a_sweep_that_sets_paths_run_dir_is_refused_before_any_job_trains(tmp_path):
    """paths.run_dir would take every job's checkpoints into one folder, away from the job's own; each job once
    refused it with a traceback as it started, leaving the sweep's folders."""
    argv = ["-m", *ONE_STEP, "optim.lr=1e-3,2e-3", "paths.run_dir=one", f"paths.log_dir={tmp_path / 'out'}"]
    proc = _fresh_python_train(argv, tmp_path)
    assert proc.returncode == 1 and proc.stdout.strip() == "LIGHT"
    assert proc.stderr.strip() == (
        "klalm-train: sweep job #0 (optim.lr=0.001): paths.run_dir=one is not the run folder: leave it out: a sweep's "
        "job folders are hydra.sweep.dir/hydra.sweep.subdir"
    )
    assert list(tmp_path.iterdir()) == []


# A sweep of good jobs runs every job (past the checks before it starts): the first sweep of
# test_a_sweep_rerun_into_a_finished_sweeps_folder_is_refused_before_anything_is_written below, the same command (it
# was run twice, ~10 s each).


def test_check_sweep_jobs_refuses_a_fresh_job_whose_folder_holds_a_run(tmp_path, caplog):
    """A re-run into a sweep's folder: a fresh job whose folder holds a finished run is refused before the sweep
    starts (Hydra would rewrite that run's `.hydra/` and the sweep's records first); a folder holding only what a
    refused start wrote is free, and a job that resumes its own folder is left to its own check."""
    sweep = tmp_path.resolve() / "sweep"
    _fake_job(sweep / "1_smoke", {"steps": 4}, ["experiment=smoke", "optim.lr=0.003"])  # a finished run
    _fake_job(sweep / "0_smoke", None, ["experiment=smoke", "optim.lr=0.001"])  # a refused start: .hydra/ only
    grid = ["experiment=smoke", f"hydra.sweep.dir={sweep}"]
    with _multirun_config([*grid, "optim.lr=1e-3,5e-3"]) as config, pytest.raises(SystemExit) as exit_info:
        check_sweep_jobs(config)
    assert exit_info.value.code == (
        f"klalm-train: sweep job #1 (optim.lr=0.005): run folder {sweep / '1_smoke'} already holds a run "
        f"(summary.json), which this start would overwrite: give the sweep another hydra.sweep.dir, or continue that "
        f"job alone (klalm-train resume={sweep / '1_smoke'} with its overrides)"
    )
    with _multirun_config([*grid, f"resume=null,{sweep / '1_smoke'}"]) as config:
        _checked_in_advance(config, caplog)


def test_a_sweep_rerun_into_a_finished_sweeps_folder_is_refused_before_anything_is_written(tmp_path):
    """The second sweep's job #0 would start afresh in the first sweep's 0_bench: it is refused in one line before
    Hydra writes anything, so the finished job's config record, multirun.yaml and summary.md still describe the runs
    they ran (Hydra once rewrote them with optim.lr=0.005 before the job's own check refused it, and summary.md then
    labelled lr=0.001's results so)."""
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "klalm.train", "-m", *ONE_STEP, f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run([*cmd, "optim.lr=0.001,0.003"], env=RUN_ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    for name, lr in (("0_bench", "0.001"), ("1_bench", "0.003")):  # a sweep of good jobs runs every job
        assert json.loads((sweep_dir / name / "summary.json").read_text())["steps"] == 1
        assert f"optim.lr={lr}" in (sweep_dir / name / ".hydra" / "overrides.yaml").read_text()
    before = {p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file()}
    assert "- optim.lr=0.001\n" in before[sweep_dir / "0_bench" / ".hydra" / "overrides.yaml"].decode()
    assert "| optim.lr=0.001 |" in before[sweep_dir / "summary.md"].decode()
    proc = subprocess.run([*cmd, "optim.lr=0.005"], env=RUN_ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert {p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file()} == before  # .hydra/, summary.md, ...
    job = sweep_dir.resolve() / "0_bench"
    refusal = proc.stderr.strip()  # one line, naming the job (all its overrides: a one-job sweep varies none)
    assert "\n" not in refusal and refusal.startswith("klalm-train: sweep job #0 (experiment=bench ")
    assert refusal.endswith(
        f" optim.lr=0.005): run folder {job} already holds a run (summary.json), which this start would overwrite: "
        f"give the sweep another hydra.sweep.dir, or continue that job alone (klalm-train resume={job} with its "
        "overrides)"
    )
