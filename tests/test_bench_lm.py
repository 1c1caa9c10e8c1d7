"""scripts/bench_lm.py: the (B, T, compile) settings of a sweep, its overrides, and the summary table with each
model's ratio to the gpt of its size and the context length at which it overtakes it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_lm", REPO / "scripts" / "bench_lm.py")
bench_lm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_lm)
Setting = bench_lm.Setting


def test_sweep_settings_fix_tokens_per_step():
    args = bench_lm.parse_args(["--seq-lens", "2048,8192,32768", "--tokens-per-step", "32768", "--compile", "both"])
    assert bench_lm.settings(args) == [
        Setting(16, 2048, False), Setting(16, 2048, True), Setting(4, 8192, False), Setting(4, 8192, True),
        Setting(1, 32768, False), Setting(1, 32768, True),
    ]  # fmt: skip
    assert bench_lm.settings(bench_lm.parse_args([])) == [Setting(16, 2048, False)]


def test_overrides_set_shape_compile_and_profiler(tmp_path):
    args = bench_lm.parse_args(["--profile", "--steps", "12"])
    overrides = bench_lm.overrides_for("kla_45m", args, Setting(4, 8192, True), tmp_path)
    assert {"data.seq_len=8192", "data.batch_size=4", "train.compile=true", "train.global_batch_tokens=32768"} <= set(
        overrides
    )
    assert "+callbacks.profile.start_step=10" in overrides and f"+callbacks.profile.out_dir={tmp_path}" in overrides


def test_compile_blocks_runs_each_block_compiled(tmp_path):
    """--compile blocks passes train.compile=blocks, names its runs apart and reads "blocks" in the sweep table."""
    args = bench_lm.parse_args(["--compile", "blocks"])
    (setting,) = bench_lm.settings(args)
    assert setting == Setting(16, 2048, "blocks") and bench_lm.run_label(setting) == "compiled-blocks"
    assert "train.compile=blocks" in bench_lm.overrides_for("gdn_45m", args, setting, tmp_path)
    rows = [{"setting": setting, "model": "gdn_45m", "perf/tokens_per_s": 100.0}]
    assert "| 2048 | 16 | blocks | 100 |" in bench_lm.sweep_table(rows, ["gdn_45m"])


def test_sweep_table_ratios_and_crossover():
    short, long = Setting(16, 2048, False), Setting(1, 32768, False)
    speeds = {(short, "gpt_45m"): 400.0, (short, "kla_45m"): 300.0, (long, "gpt_45m"): 100.0, (long, "kla_45m"): 150.0}
    rows = [{"setting": s, "model": m, "perf/tokens_per_s": v} for (s, m), v in speeds.items()]
    rows.append({"setting": long, "model": "mamba_180m", "error": "OOM"})
    text = bench_lm.sweep_table(rows, ["gpt_45m", "kla_45m", "mamba_180m"])
    assert "| 2048 | 16 | off | 400 | 300 | 0.75 | — |" in text
    assert "| 32768 | 1 | off | 100 | 150 | 1.50 | — |" in text
    assert "kla_45m overtakes gpt_45m (compile off): T = 32768" in text
    assert "mamba_180m /" not in text  # no gpt_180m in the run: no ratio column


def test_rows_saved_by_two_runs_merge_into_one_table(tmp_path):
    short, long = Setting(16, 2048, False), Setting(1, 32768, False)
    profiled = {"setting": short, "model": "gpt_45m", "perf/tokens_per_s": 4.0, "profile": "x", "kernels": "y"}
    bench_lm.save_rows([profiled], tmp_path / "a.json")
    assert "profile" not in (text := (tmp_path / "a.json").read_text()) and "kernels" not in text
    assert bench_lm.kernels_path(tmp_path / "lm.md", profiled) == tmp_path / "lm_gpt_45m_B16_T2048_eager_kernels.md"
    bench_lm.save_rows([{"setting": long, "model": "kla_45m", "perf/tokens_per_s": 2.0}], tmp_path / "b.json")
    text, _ = bench_lm.merge([tmp_path / "a.json", tmp_path / "b.json"])
    assert "| 2048 | 16 | off | 4 | — | — |" in text and "| 32768 | 1 | off | — | 2 | — |" in text


def test_a_merge_keeps_one_row_per_model_and_setting(tmp_path):
    """A run stopped in one call and repeated in the next: the measured row is shown, whichever file comes first, and
    the provenance note names the rows shown, once (it listed the failed row and the repeat both)."""
    short, long = Setting(16, 2048, True), Setting(4, 8192, True)
    call1 = {"optimizer": "AdamW (fused)", "overrides": [], "commit": "abc1234"}
    call2 = {**call1, "commit": "abc1234-dirty"}
    first = [{"setting": short, "model": "kla_45m", "perf/tokens_per_s": 3.0, "ran_with": call1},
             {"setting": long, "model": "kla_45m", "error": "Stopped: by SIGTERM", "ran_with": call1}]  # fmt: skip
    second = [{"setting": long, "model": "kla_45m", "perf/tokens_per_s": 2.0, "ran_with": call2}]
    for order in ([first, second], [second, first]):
        paths = []
        for i, rows in enumerate(order):
            bench_lm.save_rows(rows, path := tmp_path / f"{i}.json")
            paths.append(path)
        text, shown = bench_lm.merge(paths)
        assert "| 8192 | 4 | on | 2 |" in text and len(shown) == 2
        assert "- AdamW (fused), overrides: none, commit abc1234: kla_45m@2048\n" in text
        assert "- AdamW (fused), overrides: none, commit abc1234-dirty: kla_45m@8192\n" in text
        assert "Measured more than once" not in text
    again = [{**second[0], "perf/tokens_per_s": 5.0}]
    bench_lm.save_rows(again, tmp_path / "again.json")
    text, _ = bench_lm.merge([tmp_path / "0.json", tmp_path / "1.json", tmp_path / "again.json"])
    assert (
        "| 8192 | 4 | on | 5 |" in text and "Measured more than once, the last file's row kept: kla_45m@8192." in text
    )
    bench_lm.save_rows([second[0], first[0]], tmp_path / "long_first.json")
    text, shown = bench_lm.merge([tmp_path / "long_first.json", tmp_path / "again.json"])
    assert [r["setting"].seq_len for r in shown] == [8192, 2048]  # a repeat keeps its place among the rows
    assert text.index("| 2048 | 16 | on | 3 |") < text.index("| 8192 | 4 | on | 5 |")  # the table reads by T


def test_the_sweep_table_reads_by_t_and_names_the_smallest_t_a_model_overtakes_at():
    """Rows run (or merged) longest first: the table still reads by T within each compile setting, and the note
    names the smallest T at which kla leads, with the compile setting's own name ("blocks" is not "on")."""
    rows = [{"setting": Setting(1, t, compiled), "model": m, "perf/tokens_per_s": v}
            for compiled in ("blocks", True) for t in (64, 32)
            for m, v in (("gpt_tiny", 1.0), ("kla_tiny", 2.0))]  # fmt: skip
    text = bench_lm.sweep_table(rows, ["gpt_tiny", "kla_tiny"])
    order = [
        line.split(" | ")[:3] for line in text.splitlines() if line.startswith("| 32 |") or line.startswith("| 64 |")
    ]
    assert order == [["| 32", "1", "blocks"], ["| 64", "1", "blocks"], ["| 32", "1", "on"], ["| 64", "1", "on"]]
    assert "- kla_tiny overtakes gpt_tiny (compile blocks): T = 32\n" in text
    assert "- kla_tiny overtakes gpt_tiny (compile on): T = 32\n" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seq-lens", "32,abc"], "--seq-lens '32,abc' must be whole numbers"),
        (["--seq-lens", "64,32,64"], "--seq-lens names 64 more than once"),
        (["--models", "kla_45m,gpt_45m,kla_45m"], "--models names kla_45m more than once"),
        (["--merge", "missing.json"], "no such file: missing.json"),
        (["--out", "no_folder/lm.md"], "no such folder: no_folder"),
        (["--plot", "lm_sweep"], "--plot lm_sweep: no suffix names the image's format; name it e.g. lm_sweep.png ("),
        (["--plot", "lm.xyz"], "--plot lm.xyz: matplotlib cannot write .xyz files; name it e.g. lm.png ("),
    ],
)
def test_bad_arguments_are_refused_in_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        bench_lm.parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_merge_of_a_file_that_holds_no_rows_names_it_in_one_line(tmp_path):
    (table := tmp_path / "lm.md").write_text("| model | tokens/s |\n")
    (plot_into := tmp_path / "plots").mkdir()
    with pytest.raises(SystemExit, match=f"bench_lm: {table} holds no rows of bench_lm.py --out"):
        bench_lm.main(["--merge", str(table), "--plot", str(plot_into / "x.png")])


def test_sweep_plot_draws_the_measured_rows_and_refuses_none(tmp_path):
    short, long = Setting(16, 2048, True), Setting(1, 32768, True)
    speeds = [(short, "gpt_45m", 4.0), (short, "kla_45m", 3.0), (long, "gpt_45m", 1.0), (long, "kla_45m", 1.5)]
    rows = [{"setting": s, "model": m, "perf/tokens_per_s": v} for s, m, v in speeds]
    path = bench_lm.plot_sweep([*rows, {"setting": long, "model": "mamba_45m", "error": "OOM"}],
                               ["gpt_45m", "kla_45m", "mamba_45m"], tmp_path / "sweep.png")  # fmt: skip
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no row has a tokens/s value"):
        bench_lm.plot_sweep([{"setting": long, "model": "kla_45m", "error": "OOM"}], ["kla_45m"], tmp_path / "x.png")


@pytest.mark.parametrize("cut", [0, 1, 2])
def test_out_files_cut_off_mid_write_leave_the_old_ones_whole(tmp_path, monkeypatch, cut):
    """--out's table, its rows (.json) and a profiled run's kernels were written in place, after every setting: a
    command killed mid-write (a time limit) left a truncated file where the previous setting's had been."""
    row = {"setting": Setting(16, 2048, False), "model": "gpt_45m", "perf/tokens_per_s": 4.0, "kernels": "| k |"}
    out = tmp_path / "lm.md"
    files = [out, out.with_suffix(".json"), bench_lm.kernels_path(out, row)]  # in the order they are written
    for path in files:
        path.write_text("old")
    write_text, calls = Path.write_text, []

    def cut_off_at(path, data, **kwargs):
        calls.append(path)
        if len(calls) <= cut:
            return write_text(path, data, **kwargs)
        write_text(path, data[:2], **kwargs)
        raise OSError("cut off mid-write")

    monkeypatch.setattr(Path, "write_text", cut_off_at)
    with pytest.raises(OSError, match="cut off mid-write"):
        bench_lm.write_out(out, ["| table |"], [row])
    assert files[cut].read_bytes() == b"old" and sorted(tmp_path.iterdir()) == sorted(files)


def test_the_sweep_plot_cut_off_mid_write_leaves_the_old_image_whole(tmp_path, savefig_cut_off):
    """--plot's image was written in place (a docs image), and pyplot kept the figure of a failed save."""
    import matplotlib.pyplot as plt

    (plot := tmp_path / "sweep.png").write_bytes(b"old image")
    open_before = plt.get_fignums()
    with pytest.raises(OSError, match="cut off mid-write"):
        bench_lm.plot_sweep([{"setting": Setting(16, 2048, True), "model": "gpt_45m", "perf/tokens_per_s": 4.0}],
                            ["gpt_45m"], plot)  # fmt: skip
    assert plot.read_bytes() == b"old image" and list(tmp_path.iterdir()) == [plot]
    assert plt.get_fignums() == open_before


def test_repeated_runs_give_the_median_run_and_their_spread():
    setting = Setting(16, 2048, True)
    runs = [{"setting": setting, "model": "kla_45m", "perf/tokens_per_s": v, "wall_s": 1.0} for v in (90, 110, 100.0)]
    row = bench_lm.median_row(runs)
    assert row["perf/tokens_per_s"] == 100.0 and row["runs/tokens_per_s"] == [90, 110, 100.0]
    assert abs(row["runs/spread"] - 0.2) < 1e-12
    assert bench_lm.median_row(runs[:2])["perf/tokens_per_s"] == 90  # an even count: the lower middle run
    failed = {"setting": setting, "model": "kla_45m", "error": "OOM", "wall_s": 1.0}
    assert bench_lm.median_row([runs[0], failed]) is failed
    stopped = {**failed, "error": "Stopped: stopped by SIGTERM"}  # a stop cut the third run: two were measured
    cut = bench_lm.median_row([*runs[:2], stopped])
    assert cut["runs/tokens_per_s"] == [90, 110] and bench_lm.status(cut) == "ok, 2 measured runs, then stopped"
    late = {**runs[0], "status": "ok, finished after stopped by SIGTERM (its compile may have skipped autotuning)"}
    assert bench_lm.status(bench_lm.median_row([late, runs[1], runs[2]])) == late["status"]  # not the median run's
    assert bench_lm.median_row([stopped]) is stopped
    args = bench_lm.parse_args(["--repeats", "3"])
    text = bench_lm.table([row], args, setting)
    assert "each row the median of 3 runs taken in turn" in text and "| tokens/s of each run | spread |" in text
    assert "| kla_45m | — | 100 | 90, 110, 100 | 20.0% |" in text
    assert "spread" not in bench_lm.table([runs[0]], bench_lm.parse_args([]), setting)
    with pytest.raises(SystemExit):
        bench_lm.parse_args(["--repeats", "0"])


@pytest.mark.parametrize(
    "known, pair, header, cells, old_cells",
    [
        ({"perf/step_time_ms": 20.0}, {"perf/step_time_ms_median": 12.5, "perf/step_time_ms_max": 40.0},
         "| step ms | step ms median / max |", "| 20.0 | 12.5 / 40.0 |", "| 20.0 | — / — |"),
        ({"perf/peak_mem_gb": 79.2}, {"perf/peak_reserved_gb": 131.5, "perf/alloc_retries": 42},
         "| peak mem GB | reserved GB / alloc retries |", "| 79.20 | 131.50 / 42 |", "| 79.20 | — / — |"),
    ],
    ids=["median and slowest step", "reserved memory and allocator retries"],
)  # fmt: skip
def test_table_shows_a_column_pair_and_dashes_for_rows_without_it(known, pair, header, cells, old_cells):
    setting = Setting(16, 2048, True)
    row = {"setting": setting, "model": "kla_45m", "perf/tokens_per_s": 100.0, **known, **pair, "wall_s": 1.0}
    text = bench_lm.table([row], bench_lm.parse_args([]), setting)
    assert header in text and cells in text
    old = {k: v for k, v in row.items() if k not in pair}  # a row from before the pair was recorded
    assert old_cells in bench_lm.table([old], bench_lm.parse_args([]), setting)


def test_optimizer_names_say_fused_or_foreach():
    def name(**optim):
        return bench_lm.optimizer_name(OmegaConf.create(optim))

    assert name(_target_="torch.optim.AdamW", fused=True) == "AdamW (fused)"
    assert name(_target_="torch.optim.AdamW", fused=None) == "AdamW (foreach)"
    assert name(_target_="torch.optim.SGD") == "SGD"


def test_a_merged_table_names_rows_that_ran_differently():
    short, long = Setting(16, 2048, True), Setting(1, 32768, True)
    fused = {"optimizer": "AdamW (fused)", "overrides": [], "commit": "abc1234"}
    rows = [{"setting": short, "model": "kla_45m", "perf/tokens_per_s": 3.0, "ran_with": fused},
            {"setting": long, "model": "kla_45m", "perf/tokens_per_s": 2.0, "ran_with": fused}]  # fmt: skip
    alike = bench_lm.sweep_table(rows, ["kla_45m"])
    assert "All rows ran with AdamW (fused), overrides: none, commit abc1234." in alike
    foreach = {**fused, "overrides": ["optim.fused=false"], "optimizer": "AdamW (foreach)"}
    old = {"setting": long, "model": "gpt_45m", "perf/tokens_per_s": 1.0}  # saved before rows recorded how they ran
    rows += [{"setting": short, "model": "gpt_45m", "perf/tokens_per_s": 4.0, "ran_with": foreach}, old]
    text = bench_lm.sweep_table(rows, ["kla_45m", "gpt_45m"])
    assert "**The rows did not all run alike:**" in text
    assert "- AdamW (fused), overrides: none, commit abc1234: kla_45m@2048, kla_45m@32768" in text
    assert "- AdamW (foreach), overrides: optim.fused=false, commit abc1234: gpt_45m@2048" in text
    assert "- optimiser, overrides and commit not recorded: gpt_45m@32768" in text


def test_a_cpu_run_records_how_it_ran(tmp_path, monkeypatch):
    monkeypatch.setenv("KLALM_COMMIT", "test123")
    out = tmp_path / "lm.md"
    argv = ["--models", "gpt_tiny", "--trainer", "cpu", "--seq-len", "32", "--batch-size", "2", "--steps", "4",
            "--log-every", "2", "--override", "optim.fused=false", "--out", str(out)]  # fmt: skip
    assert bench_lm.main(argv) == 0
    (row,) = json.loads(out.with_suffix(".json").read_text())
    assert row["ran_with"] == {"optimizer": "AdamW (foreach)", "overrides": ["optim.fused=false"], "commit": "test123"}
    assert "All rows ran with AdamW (foreach), overrides: optim.fused=false, commit test123." in out.read_text()


def test_out_keeps_the_settings_finished_before_a_stop(tmp_path, monkeypatch):
    """--out is written after every setting: a command stopped (a time limit) in the second keeps the first's rows."""
    out = tmp_path / "lm.md"
    calls = []

    def fake_bench_one(model, args, setting, root, repeat=0):
        if setting.compile:  # the second setting of --compile both: stopped, as `timeout` would
            raise KeyboardInterrupt
        calls.append(setting)
        return {"model": model, "setting": setting, "perf/tokens_per_s": 1234.0, "wall_s": 1.0, "ran_with": None}

    monkeypatch.setattr(bench_lm, "bench_one", fake_bench_one)
    argv = ["--models", "gpt_tiny", "--trainer", "cpu", "--seq-len", "32", "--batch-size", "2", "--steps", "4",
            "--log-every", "2", "--compile", "both", "--out", str(out)]  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        bench_lm.main(argv)
    assert [s.compile for s in calls] == [False]
    (row,) = json.loads(out.with_suffix(".json").read_text())
    assert row["model"] == "gpt_tiny" and row["setting"]["compile"] is False
    assert "1,234" in out.read_text()


def test_every_run_compiles_afresh(monkeypatch):
    """A process timing several T once compiled the second T as a recompile, with its batch and length dynamic
    (TORCH_LOGS=recompiles: "size mismatch at index 0"), and the third reused that dynamic graph. Each run now
    starts from a reset compiler, as a training run of one shape does."""
    import torch

    events = []
    monkeypatch.setattr(torch.compiler, "reset", lambda: events.append("reset"))
    monkeypatch.setattr(bench_lm, "run", lambda cfg: events.append(cfg.data.seq_len) or {"perf/tokens_per_s": 1.0})
    argv = ["--models", "gpt_tiny", "--trainer", "cpu", "--seq-lens", "32,64", "--batch-size", "2", "--steps", "4",
            "--log-every", "2"]  # fmt: skip
    assert bench_lm.main(argv) == 0
    assert events == ["reset", 32, "reset", 64]


def test_sigterm_stops_a_model_inside_its_step(tmp_path, monkeypatch):
    """SIGTERM during a long step (a compile of minutes on the GPU; here a sleep in the first training step) stops
    the command at once: without bench_lm's handler Lightning only notes the signal and ends the run after the step,
    and the bench went on to the next model. The finished model keeps its row, the stopped one says so."""
    import os
    import signal
    import time

    from klalm.train.module import LMModule

    step = LMModule.training_step

    def slow_first_step(self, dataloader_iter):  # the parameter's name tells Lightning to pass the iterator
        if self.model.config.arch == "kla":  # the second model: the first (gpt) finishes normally
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(20)  # interrupted by the handler's exception, or not at all
        return step(self, dataloader_iter)

    monkeypatch.setattr(LMModule, "training_step", slow_first_step)
    out = tmp_path / "lm.md"
    argv = ["--models", "gpt_tiny,kla_tiny,mamba_tiny", "--trainer", "cpu", "--seq-len", "32", "--batch-size", "2",
            "--steps", "4", "--log-every", "2", "--out", str(out)]  # fmt: skip
    handler = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    assert bench_lm.main(argv) == bench_lm.STOPPED_EXIT_CODE
    assert time.monotonic() - started < 20  # not after the sleep: a hang guard, not a speed test
    assert signal.getsignal(signal.SIGTERM) is handler  # restored
    gpt, kla = json.loads(out.with_suffix(".json").read_text())  # mamba never started
    assert gpt["model"] == "gpt_tiny" and "error" not in gpt
    assert kla["model"] == "kla_tiny" and kla["error"] == "Stopped: stopped by SIGTERM"


@pytest.mark.parametrize("caught", ["swallowed", "swallowed-then-done", "wrapped"])
def test_sigterm_stops_a_model_whose_compiler_catches_the_stop(tmp_path, monkeypatch, caught):
    """torch's compiler catches what is raised inside it: on the GPU one Stopped was logged as a warning and the
    compile went on until `timeout -k` killed the process (no row written), another came out as
    "BackendCompilerFailed: backend='inductor' raised:" and the command went on to the next setting. SIGTERM is sent
    again every RESTOP_S seconds while the run goes on, and any failure after SIGTERM is reported as the stop, also
    Lightning's exit 143 when the step ends before the next SIGTERM ("swallowed-then-done")."""
    import os
    import signal
    import time

    from klalm.train.module import LMModule

    monkeypatch.setattr(bench_lm, "RESTOP_S", 0.2)
    collect = bench_lm.gc.collect  # slow, as freeing a GPU model can be: the repeated stops must not cut the row
    monkeypatch.setattr(bench_lm.gc, "collect", lambda: time.sleep(0.5) or collect())
    step = LMModule.training_step

    def catching_step(self, dataloader_iter):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(20)
        except bench_lm.Stopped as err:
            if caught == "wrapped":
                raise RuntimeError("backend='inductor' raised:\nStopped") from err
        if caught == "swallowed":
            time.sleep(20)  # the compile goes on, until the next SIGTERM
        return step(self, dataloader_iter)

    monkeypatch.setattr(LMModule, "training_step", catching_step)
    out = tmp_path / "lm.md"
    argv = ["--models", "gpt_tiny", "--trainer", "cpu", "--seq-lens", "32,64", "--batch-size", "2", "--steps", "4",
            "--log-every", "2", "--out", str(out)]  # fmt: skip
    started = time.monotonic()
    assert bench_lm.main(argv) == bench_lm.STOPPED_EXIT_CODE
    assert time.monotonic() - started < 20  # a hang guard, not a speed test
    assert not bench_lm._stop  # the thread repeating the stop has ended (joined)
    (row,) = json.loads(out.with_suffix(".json").read_text())  # T 64 never started
    assert row["setting"]["seq_len"] == 32 and row["error"] == "Stopped: stopped by SIGTERM"


def test_a_run_that_finishes_after_sigterm_keeps_its_numbers_and_says_so(tmp_path, monkeypatch):
    """torch's compiler may swallow the stop and the run end normally: its row was "ok" like any other."""

    def finishes_anyway(cfg):
        bench_lm._stop.setdefault("by", "stopped by SIGTERM")  # as the handler notes it, caught inside the run
        return {"perf/tokens_per_s": 5.0}

    monkeypatch.setattr(bench_lm, "run", finishes_anyway)
    monkeypatch.setattr(bench_lm, "_stop", {})
    args = bench_lm.parse_args(["--models", "gpt_tiny", "--trainer", "cpu", "--seq-len", "32", "--steps", "4",
                                "--log-every", "2"])  # fmt: skip
    with bench_lm.initialize_config_module("klalm.configs", version_base="1.3"):
        row = bench_lm.bench_one("gpt_tiny", args, Setting(2, 32, True), tmp_path)
    assert row["perf/tokens_per_s"] == 5.0 and "error" not in row
    assert bench_lm.status(row) == "ok, finished after stopped by SIGTERM (its compile may have skipped autotuning)"


def test_sigterm_between_two_runs_keeps_the_finished_row(tmp_path, monkeypatch):
    """SIGTERM after a model's run, while the bench frees it: its row is kept and written, no other run starts (the
    Stopped this raised outside the run once lost every row of the setting)."""
    import os
    import signal
    import time

    collect = bench_lm.gc.collect

    def collect_then_stop():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        collect()

    monkeypatch.setattr(bench_lm.gc, "collect", collect_then_stop)
    out = tmp_path / "lm.md"
    argv = ["--models", "gpt_tiny,kla_tiny", "--trainer", "cpu", "--seq-len", "32", "--batch-size", "2", "--steps",
            "4", "--log-every", "2", "--out", str(out)]  # fmt: skip
    assert bench_lm.main(argv) == bench_lm.STOPPED_EXIT_CODE
    (row,) = json.loads(out.with_suffix(".json").read_text())
    assert row["model"] == "gpt_tiny" and "error" not in row and row["perf/tokens_per_s"] > 0
