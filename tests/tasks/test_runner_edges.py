"""`klalm-synthetic` on input a newcomer gets wrong: one line on stderr naming the flag, key, file or value, and
nothing written (no folder made, no results file appended to, no document or plot rewritten); Ctrl-C ends a block
with one line, starting nothing more."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from klalm.cli import synthetic
from klalm.tasks.cells import TrainSettings
from klalm.tasks.plans import A5Plan, A5Stage, Estimate, RunPlan
from klalm.tasks.results import Results, read_jsonl
from klalm.tasks.runner import GridBlock
from klalm.tasks.units import state_name

COMMITTED = Path(__file__).resolve().parents[2] / "results" / "synthetic"
CPU_A5 = ["--plan", "cpu", "--families", "a5", "--archs", "gpt", "--a5-lengths", "3", "--a5-depths", "1"]


def _refused(argv: list[str], message: str) -> str:
    """Runs synthetic(argv), which must end with one line `klalm-synthetic: ...` matching `message`; returns it."""
    with pytest.raises((SystemExit, KeyError, ValueError, TypeError, OSError)) as info:  # a traceback fails below
        synthetic(argv)
    assert info.type is SystemExit, f"{info.type.__name__}: {info.value}"
    text = str(info.value.code)
    assert text.startswith("klalm-synthetic: ") and "\n" not in text, text
    assert any(part in text for part in message.split("|")), text
    return text


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_help_and_usage_errors_answer_before_torch_is_imported(console_in_fresh_python):
    """The parser ran in klalm.tasks.runner, after klalm.tasks had imported torch: `klalm-synthetic --help` took 6 s."""
    said = []
    for argv, status, stream in (
        (["--help"], 0, "stdout"),
        (["run", "--help"], 0, "stdout"),
        (["run", "--results", "x", "--lrs", "1e-3,fast"], 2, "stderr"),
    ):
        proc = console_in_fresh_python("synthetic", "klalm-synthetic", argv, ("torch", "matplotlib"))
        said.append(getattr(proc, stream))
        assert said[-1].startswith("usage: klalm-synthetic "), proc.stderr[-2000:]
        assert proc.stdout.splitlines()[-2:] == [f"exit {status}", "heavy []"], proc.stdout[-2000:]
    top, run, refused = said
    assert "Run a synthetic plan in blocks" in top and "klalm-synthetic curves --family mqar" in top
    assert "subsetofmad_in_context_recall,mad_noisy_recall," in "".join(run.split())  # --mad-tasks: MAD_TASKS
    assert refused.splitlines()[-1].endswith("argument --lrs: invalid float_list value: '1e-3,fast'")


@pytest.mark.parametrize(
    ("knob", "message"),
    [
        (["--steps", "0"], "a5.train.steps=0 must be >= 1 (--steps"),
        (["--lrs", "inf"], "learning rates must be finite, got [inf]"),
        (["--lrs", "nan"], "learning rates must be finite, got [nan]"),
        (["--lrs=-1e-3"], "learning rates must be > 0, got [-0.001]"),
        (["--lrs", "1e-3,-1e-3"], "learning rates must be > 0, got [0.001, -0.001]"),
        (["--mad-weight-decays", "nan"], "mad.weight_decays must be finite"),
        (["--max-state-mib", "-3"], "max_state_mib=-3.0 must be > 0"),
        (["--gpus", "-1"], "--gpus must be >= 0, got -1"),
        (["--lrs", "-inf"], "learning rates must be > 0, got [-inf]"),
        (["--archs", ""], "--archs names nothing"),
        (["--seeds", ""], "--seeds names nothing"),
        (["--families", ","], "--families names nothing"),
        (["--mqar-cells", ","], "--mqar-cells names nothing"),
    ],
)
def test_nonsense_knobs_are_one_line_and_make_no_folder(tmp_path, knob, message):
    for verb in ("plan", "run"):
        _refused([verb, *CPU_A5, "--results", str(tmp_path / "new"), "--state", str(tmp_path / "s"), *knob], message)
    assert list(tmp_path.iterdir()) == []


def test_run_refuses_a_budget_flag_it_cannot_use_and_plan_ignores_the_budget(tmp_path, monkeypatch):
    """`plan --time-budget-s nan` was refused although plan ignores the budget; `--finish-only` without a deadline,
    and `--gpus N` on the CPU (N CPU slots), were taken silently."""
    import torch

    monkeypatch.setattr(GridBlock, "run", lambda self: pytest.fail("a block ran"))
    run = ["run", *CPU_A5, "--results", str(tmp_path / "r"), "--state", str(tmp_path / "s")]
    _refused([*run, "--time-budget-s", "nan"], "--time-budget-s nan must be a number of seconds (inf: no deadline)")
    _refused([*run, "--time-budget-s", "inf", "--finish-only"], "--finish-only needs a deadline (--time-budget-s, or")
    _refused([*run, "--gpus", "2"], "--gpus 2: units run on the CPU here (device='cpu'), where --procs-per-gpu alone")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _refused(["plan", *CPU_A5, "--device", "auto", "--results", str(tmp_path / "r"), "--gpus", "1"],
             "--gpus 1: units run on the CPU here (torch sees no CUDA device)")  # fmt: skip
    assert list(tmp_path.iterdir()) == []
    synthetic(["plan", *CPU_A5, "--results", str(tmp_path / "r"), "--time-budget-s", "nan", "--gpus", "0"])


@pytest.mark.parametrize(
    ("lrs", "message"),
    [
        ("-1e-3", "mqar.stages[0].lrs: learning rates must be > 0, got [-0.001]"),
        ("-1e-3,1e-3", "mqar.stages[0].lrs: learning rates must be > 0, got [-0.001, 0.001]"),
        ("-5E-4", "mqar.stages[0].lrs: learning rates must be > 0, got [-0.0005]"),
    ],
)
def test_a_negative_value_after_a_space_is_the_flags_value_not_an_option(tmp_path, lrs, message):
    """argparse (Python 3.11) took `--lrs -1e-3` for two options and said only "--lrs: expected one argument"."""
    _refused(["run", *CPU_A5, "--results", str(tmp_path / "r"), "--state", str(tmp_path / "s"), "--lrs", lrs], message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("members: two\n", "members='two' must be int"),
        ("archs: kla\n", "archs='kla' must be list[str]"),
        ("a5: 3\n", "a5 must be a mapping of A5Plan's keys"),
        ("a5:\n  stages: 5\n", "a5.stages must be a list of stages"),
        ("a5:\n  stages: [{lengths: 3, depths: [1], seeds: [0]}]\n", "a5.stages[0].lengths=3 must be list[int]"),
        ("mqar:\n  train: {steps: ten}\n", "mqar.train.steps='ten' must be int"),
        ("estimate: {tokens_per_s: {kla: fast}}\n", "must be dict[str, float]"),
        ("- a\n- b\n", "must be a mapping of RunPlan's keys"),
        ("archs: [kla\n", "plan.yaml:2: expected ',' or ']'"),
        ("x: ${oops}\n", "Interpolation key 'oops' not found"),
        ("time_budget_s: -5\n", "time_budget_s=-5 must be > 0 (null: no deadline)"),
        ("time_budget_s: 0\n", "time_budget_s=0 must be > 0 (null: no deadline)"),
        ("", "plan.yaml is empty: it sets no key"),  # had read as a plan of defaults: "no prior for arch 'kla'"
        ("# only a comment\n", "plan.yaml is empty: it sets no key"),
    ],
)
def test_a_plan_file_with_a_wrong_type_or_bad_yaml_is_one_line_naming_the_key(tmp_path, text, message):
    (tmp_path / "plan.yaml").write_text(text)
    _refused(["plan", "--plan", str(tmp_path / "plan.yaml"), "--results", str(tmp_path / "r")], message)
    assert not (tmp_path / "r").exists()


def test_a_plan_that_is_a_folder_is_one_line_saying_so(tmp_path, monkeypatch):
    """A folder without a suffix had been looked up as a plan name: "no file .../configs/synthetic/plans.yaml"."""
    monkeypatch.chdir(tmp_path)
    for folder in ("plans", "./plans", str(tmp_path / "plans"), "plans.yaml"):
        (tmp_path / folder).mkdir(exist_ok=True)
        _refused(["plan", "--plan", folder, "--results", "r"], f"plan {folder!r} is a folder, not a plan YAML file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plans", "plans.yaml"]


def test_an_arch_with_neither_rates_nor_a_prior_is_refused_before_the_block_starts(tmp_path):
    plan = tmp_path / "plan.yaml"  # no estimate.tokens_per_s: the first unit's estimate had failed mid-block
    plan.write_text(
        "archs: [gpt]\nfamilies: [a5]\ndevice: cpu\na5:\n  stages: [{lengths: [3], depths: [1], seeds: [0]}]\n"
    )
    for verb in ("plan", "run"):
        _refused([verb, "--plan", str(plan), "--results", str(tmp_path / "r")], "no prior for arch 'gpt'")
    assert not (tmp_path / "r").exists()


def test_plan_lists_without_a_state_folder_and_writes_nothing(tmp_path, capsys):
    """The cpu plan has a time budget, which a block needs --state for; `plan` runs no block and makes no folder."""
    synthetic(["plan", *CPU_A5, "--results", str(tmp_path / "new" / "results")])
    assert "| a5 length=3 gpt depth=1 d=32" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_plan_into_a_pipe_closed_early_ends_quietly(tmp_path, monkeypatch, capsys):
    """`plan ... | head -1`: the table's write into the closed pipe was refused as bad input, "klalm-synthetic: [Errno
    32] Broken pipe" on stderr, where every other command's table ends quietly (exit code 1, as Unix tools do)."""
    reader, writer = os.pipe()
    os.close(reader)
    with open(writer, "w", buffering=1) as closed:  # line by line: the first line meets the closed pipe in print
        monkeypatch.setattr(sys, "stdout", closed)
        with pytest.raises(SystemExit) as info:
            synthetic(["plan", *CPU_A5, "--results", str(tmp_path / "r")])
    assert info.value.code == 1 and capsys.readouterr().err == ""


def test_folders_that_are_files_are_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "a5.jsonl").write_bytes((COMMITTED / "a5.jsonl").read_bytes())
    state = ["--state", str(tmp_path / "s")]
    cases = [
        (["plan", *CPU_A5, "--results", str(afile)], "--results folder"),
        (["run", *CPU_A5, "--results", str(afile / "sub"), *state], f"{afile} is a file, not a folder"),
        (["run", *CPU_A5, "--results", str(tmp_path / "r"), "--state", str(afile)], "--state folder"),
        (["report", "--plan", "full", "--results", str(tmp_path / "rows"), "--out", str(afile)], "--out folder"),
        (["merge", "--from", str(tmp_path / "rows"), "--results", str(afile)], "--results folder"),
        (["progress", "--state", str(tmp_path), "--results", str(afile)], "--results folder"),
        (["positions", "--results", str(afile)], "--results folder"),
        (["pack", "--state", str(afile), "--out", str(tmp_path / "p")], "state folder"),
    ]
    for argv, message in cases:
        assert "is a file, not a folder" in _refused(argv, message)
    assert afile.read_text() == "not a folder\n" and sorted(p.name for p in tmp_path.iterdir()) == ["afile", "rows"]


def test_report_on_an_empty_results_folder_keeps_the_document(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# results\n<!-- synthetic:a5 -->\nthe tables so far\n<!-- /synthetic:a5 -->\n")
    (tmp_path / "empty").mkdir()
    for where in (["--doc", str(doc)], ["--out", str(tmp_path / "out")]):
        argv = ["report", "--plan", "cpu", "--families", "a5", "--results", str(tmp_path / "empty"), *where]
        _refused(argv, "holds no row of a5")
    assert "the tables so far" in doc.read_text() and sorted(p.name for p in tmp_path.iterdir()) == ["doc.md", "empty"]


def test_report_on_rows_of_another_plan_keeps_the_document(tmp_path):
    """The committed rows are the full plan's: under `--plan cpu` (or report's default, full, over a CPU run's rows)
    every table read 'not run', and the document's sections were rewritten so."""
    doc = tmp_path / "doc.md"
    doc.write_text("# results\n<!-- synthetic:a5 -->\nthe tables so far\n<!-- /synthetic:a5 -->\n")
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "a5.jsonl").write_bytes((COMMITTED / "a5.jsonl").read_bytes())
    argv = ["report", "--plan", "cpu", "--families", "a5", "--results", str(tmp_path / "rows"), "--doc", str(doc)]
    _refused(argv, "row(s) of a5 (a5.jsonl, progress.jsonl) but none of a unit of plan 'cpu' with these knobs")
    assert "the tables so far" in doc.read_text() and not (tmp_path / "img").exists()


def test_report_checks_the_document_before_it_writes_a_plot(tmp_path):
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "a5.jsonl").write_bytes((COMMITTED / "a5.jsonl").read_bytes())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "plain.md").write_text("# no markers\n")
    report = ["report", "--plan", "full", "--families", "a5", "--results", str(tmp_path / "rows")]
    plain = tmp_path / "docs" / "plain.md"
    assert _refused([*report, "--doc", str(plain)], "lacks the markers") == (
        f"klalm-synthetic: --doc {plain}: the document lacks the markers <!-- synthetic:a5 --> … <!-- /synthetic:a5 -->"
    )
    _refused([*report, "--doc", str(tmp_path / "docs" / "missing.md")], "missing.md does not exist")
    assert not (tmp_path / "docs" / "img").exists()  # the plots were written before the markers were looked for


def test_merge_refuses_folders_it_cannot_use_and_appends_nothing_from_a_broken_file(tmp_path):
    row = (COMMITTED / "a5.jsonl").read_text().splitlines()[0]
    source, dest = tmp_path / "back", tmp_path / "dest"
    source.mkdir()
    dest.mkdir()
    (source / "a5.jsonl").write_text(row + "\n")
    (source / "mqar.jsonl").write_text('{"family": "mqar", "task": {"na\n')  # a half-written line
    _refused(["merge", "--from", str(source), "--results", str(dest)], "mqar.jsonl:1: not a JSON row")
    assert _files(dest) == {}  # a5.jsonl was appended before the broken mqar.jsonl was read
    (source / "mqar.jsonl").unlink()
    _refused(["merge", "--from", str(source), "--results", str(tmp_path / "nowhere")], "--results folder")
    (tmp_path / "no_rows").mkdir()
    _refused(["merge", "--from", str(tmp_path / "no_rows"), "--results", str(dest)], "holds no results file")
    assert _files(dest) == {} and not (tmp_path / "nowhere").exists()


def test_positions_and_curves_refuse_a_broken_results_file_and_a_plot_nowhere(tmp_path, capsys):
    (tmp_path / "broken").mkdir()
    row = (COMMITTED / "a5.jsonl").read_text().splitlines()[0]
    (tmp_path / "broken" / "a5.jsonl").write_text(row + '\n{"family": "a5", "ta\n')
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "a5.jsonl").write_bytes((COMMITTED / "a5.jsonl").read_bytes())
    for verb in ("positions", "curves"):
        _refused([verb, "--results", str(tmp_path / "broken")], "a5.jsonl:2: not a JSON row")
        _refused([verb, "--results", str(tmp_path / "rows"), "--plot", str(tmp_path / "no" / "x.png")], "--plot")
    assert capsys.readouterr().out == ""  # refused before the table, not after it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "rows"]


def test_a_plot_name_that_names_no_image_format_is_refused_before_the_table(tmp_path, capsys):
    """`--plot positions` wrote PNG bytes to a file named `positions`, and `--plot p.xyz` ended in matplotlib's
    traceback once the table was printed (scripts/plot_loss.py's --out is checked so: `image_name_problem`)."""
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "a5.jsonl").write_bytes((COMMITTED / "a5.jsonl").read_bytes())
    rows, state = ["--results", str(tmp_path / "rows")], ["--state", str(tmp_path / "state")]
    for name, why in (("p", "no suffix names the image's format"), ("p.xyz", "matplotlib cannot write .xyz files")):
        plot = tmp_path / name
        for argv in (["positions", *rows], ["curves", *rows], ["evaluate", *state]):
            said = _refused([*argv, "--plot", str(plot)], f"--plot {plot}: {why}; name it e.g. {tmp_path / 'p.png'}")
            assert said.startswith(f"klalm-synthetic: --plot {plot}: "), said
    assert capsys.readouterr().out == "" and sorted(p.name for p in tmp_path.iterdir()) == ["rows"]


def test_every_committed_results_row_has_the_fields_its_readers_index():
    for path in sorted(COMMITTED.glob("*.jsonl")):
        assert read_jsonl(path), path  # a row of the wrong shape raises ValueError naming it


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda row: {}, "a5.jsonl:3: missing family, task, arch,"),
        (lambda row: [1, 2], "a5.jsonl:3: not a JSON object: [1, 2]"),
        (lambda row: {**row, "token_acc": "high"}, 'a5.jsonl:3: token_acc="high" must be a number in [0, 1]'),
        (lambda row: {**row, "token_acc": 1.5}, "a5.jsonl:3: token_acc=1.5 must be a number in [0, 1]"),
        (lambda row: {**row, "steps": -5}, "a5.jsonl:3: steps=-5 must be an integer >= 0"),
        (lambda row: {k: v for k, v in row.items() if k != "seed"}, "a5.jsonl:3: missing seed"),
        (lambda row: {**row, "evals": [5]}, "a5.jsonl:3: evals=[5] must be a list of [step, loss"),
        (lambda row: {**row, "family": "mqar"}, 'a5.jsonl:3: family="mqar": a row of a5.jsonl must be of family'),
    ],
)
def test_results_rows_of_the_wrong_shape_are_one_line_naming_file_line_and_field(tmp_path, change, message):
    """Valid JSON of the wrong shape had given a KeyError or TypeError traceback in report, merge, curves and
    positions (or "klalm-synthetic: family"), and merge had appended token_acc "high" or steps -5."""
    rows = (COMMITTED / "a5.jsonl").read_text().splitlines()[:2]
    bad = json.dumps(change({**json.loads(rows[0]), "seed": 7}))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a5.jsonl").write_text("\n".join([*rows, bad]) + "\n")
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "a5.jsonl").write_text(rows[0] + "\n")
    before = _files(tmp_path)
    bad_folder = str(tmp_path / "bad")
    for argv in (["report", "--plan", "full", "--families", "a5", "--results", bad_folder, "--out",
                  str(tmp_path / "out")],
                 ["merge", "--from", bad_folder, "--results", str(tmp_path / "dest")],
                 ["merge", "--from", str(tmp_path / "dest"), "--results", bad_folder],
                 ["curves", "--results", bad_folder], ["positions", "--results", bad_folder],
                 ["plan", *CPU_A5, "--results", bad_folder]):  # fmt: skip
        _refused(argv, message)
    assert _files(tmp_path) == before


def test_progress_and_rates_rows_of_the_wrong_shape_are_one_line(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "s").mkdir()
    (tmp_path / "r" / "progress.jsonl").write_text('{"family": "a5", "steps": 3}\n')
    _refused(["curves", "--results", str(tmp_path / "r")], "progress.jsonl:1: missing task, arch,")
    _refused(["progress", "--state", str(tmp_path / "s"), "--results", str(tmp_path / "r")], "progress.jsonl:1")
    (tmp_path / "r" / "progress.jsonl").unlink()
    rate = json.loads((COMMITTED / "rates.jsonl").read_text().splitlines()[0])
    plan = ["plan", *CPU_A5, "--results", str(tmp_path / "r")]
    (tmp_path / "r" / "rates.jsonl").write_text(json.dumps({**rate, "step_s": "slow"}) + "\n")
    _refused(plan, 'rates.jsonl:1: step_s="slow" must be a finite number')
    (tmp_path / "r" / "rates.jsonl").write_text(json.dumps({k: v for k, v in rate.items() if k != "arch"}) + "\n")
    _refused(plan, "rates.jsonl:1: missing arch")


def test_ctrl_c_ends_a_run_with_one_line_and_exit_code_130(tmp_path, monkeypatch, capsys):
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(GridBlock, "run", interrupted)
    with pytest.raises((SystemExit, KeyboardInterrupt)) as info:
        synthetic(["run", *CPU_A5, "--results", str(tmp_path / "r"), "--state", str(tmp_path / "s")])
    assert info.type is SystemExit and info.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("klalm-synthetic: interrupted: 0 row(s) written in this block are kept in")


def test_a_second_run_into_the_same_results_folder_is_refused_while_the_first_runs(tmp_path, monkeypatch):
    """Two runs into one results folder both trained the units left and appended each one's rows twice."""
    argv = ["run", *CPU_A5, "--results", str(tmp_path / "r"), "--time-budget-s", "inf"]
    second = []

    def run_beside(self):  # the first block, running: a second command into its folder
        with pytest.raises(SystemExit) as info:
            synthetic(argv)
        second.append(str(info.value.code))

    monkeypatch.setattr(GridBlock, "run", run_beside)
    synthetic(argv)
    assert second == [
        f"klalm-synthetic: --results folder {tmp_path / 'r'} is in use by another klalm-synthetic command (a run, "
        "merge or progress): try again once it has ended (two at once would write rows twice, a block training the "
        "units whose rows come meanwhile)"
    ]
    monkeypatch.setattr(GridBlock, "run", lambda self: second.append("ran"))
    (tmp_path / "r" / "rates.jsonl").write_text("{cut short\n")
    _refused(argv, "rates.jsonl:1: not a JSON row")  # refused with the folder held: it lets it go too
    (tmp_path / "r" / "rates.jsonl").unlink()
    synthetic(argv)  # the first one's end let the folder go
    assert second[-1] == "ran"


def test_merge_and_progress_into_a_results_folder_a_run_holds_are_refused(tmp_path, monkeypatch):
    """merge and progress append to the folder a block appends to (merge a row the block may train as well) and took
    no lock. The refusal says what holds the folder as far as it is known: another command, not (as it said for
    whatever held it) a block."""
    from klalm.tasks import folders

    row = (COMMITTED / "a5.jsonl").read_text().splitlines()[0]
    (tmp_path / "back").mkdir()
    (tmp_path / "back" / "a5.jsonl").write_text(row + "\n")
    _saved_state(tmp_path / "s", _cpu_a5_unit())
    results = str(tmp_path / "r")
    merge = ["merge", "--from", str(tmp_path / "back"), "--results", results]
    progress = ["progress", "--state", str(tmp_path / "s"), "--results", results]
    in_use = f"--results folder {results} is in use by another klalm-synthetic command (a run, merge or progress): try"
    beside = []

    def run_beside(self):  # a block running into r: merge and progress into it
        beside.extend(_refused(argv, in_use) for argv in (merge, progress))
        assert _files(tmp_path / "r") == {}

    monkeypatch.setattr(GridBlock, "run", run_beside)
    synthetic(["run", *CPU_A5, "--results", results, "--time-budget-s", "inf"])
    merge_into = folders._merge_into

    def progress_beside(args, parts):  # a merge into r: progress into it
        beside.append(_refused(progress, in_use))
        merge_into(args, parts)

    monkeypatch.setattr(folders, "_merge_into", progress_beside)
    synthetic(merge)  # the run has ended
    assert len(beside) == 3 and beside[2] == beside[1]  # the same words, whatever holds the folder
    synthetic(progress)
    assert sorted(_files(tmp_path / "r")) == ["a5.jsonl", "progress.jsonl"]


def test_merge_and_progress_refuse_a_folder_that_is_not_a_results_folder(tmp_path, capsys):
    """`merge --results results` appended a5.jsonl to the folder of the results folders."""
    row = (COMMITTED / "a5.jsonl").read_text().splitlines()[0]
    (tmp_path / "back").mkdir()
    (tmp_path / "back" / "a5.jsonl").write_text(row + "\n")
    _saved_state(tmp_path / "s", _cpu_a5_unit())
    parent = tmp_path / "results"
    (parent / "synthetic").mkdir(parents=True)
    (parent / "README.md").write_text("results folders\n")
    before = _files(tmp_path)
    for argv in (["merge", "--from", str(tmp_path / "back"), "--results", str(parent)],
                 ["progress", "--state", str(tmp_path / "s"), "--results", str(parent)]):  # fmt: skip
        _refused(argv, f"--results folder {parent} is not a results folder: it holds none of a5.jsonl, mqar.jsonl, "
                 "mad.jsonl, rates.jsonl, progress.jsonl and is not empty (a new one must be)")  # fmt: skip
    assert _files(tmp_path) == before
    (parent / "synthetic" / "rates.jsonl").write_text("")  # a results file, with or without rows, marks one
    synthetic(["merge", "--from", str(tmp_path / "back"), "--results", str(parent / "synthetic")])
    synthetic(["progress", "--state", str(tmp_path / "s"), "--results", str(tmp_path / "new")])  # made: empty
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"a5.jsonl": 1},
                                                                                   {"progress.jsonl": 1}]  # fmt: skip


def test_merge_and_progress_work_where_the_file_system_has_no_locks(tmp_path, monkeypatch, capsys, caplog):
    """On a file system without working flocks (NFS without its lock service), merge and progress, which took no lock
    before, ended in a traceback (merge) or were refused (progress): as klalm-train's run folders, they warn that one
    writer is not enforced and go on."""
    import errno

    fcntl = pytest.importorskip("fcntl")  # (POSIX)

    def no_locks(descriptor, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    row = (COMMITTED / "a5.jsonl").read_text().splitlines()[0]
    (tmp_path / "back").mkdir()
    (tmp_path / "back" / "a5.jsonl").write_text(row + "\n")
    _saved_state(tmp_path / "s", _cpu_a5_unit())
    results = tmp_path / "r"
    results.mkdir()
    monkeypatch.setattr(fcntl, "flock", no_locks)
    with caplog.at_level("WARNING", logger="klalm.synthetic"):
        synthetic(["merge", "--from", str(tmp_path / "back"), "--results", str(results)])
        synthetic(["progress", "--state", str(tmp_path / "s"), "--results", str(results)])
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"a5.jsonl": 1},
                                                                                   {"progress.jsonl": 1}]  # fmt: skip
    assert caplog.text.count("--results folder") == 2 and caplog.text.count("file locks unsupported here") == 3
    assert caplog.text.count(f"state folder {tmp_path / 's'}: file locks unsupported here") == 1  # progress read it


def test_progress_and_pack_read_a_state_folder_they_cannot_write(tmp_path, monkeypatch, capsys, caplog):
    """A state folder on a read-only mount (or another user's): progress (and evaluate) read it without a lock before
    they took the state folder's lock, which opens `.lock` to write; since, progress was refused and evaluate ended in
    a traceback ("Read-only file system: .../.lock"). Readers now read it unlocked, warned once, as `plan` checks
    its states. The mount is simulated: os.open to write under the folder fails with EROFS and os.access says it is
    not writable (the tests may run as root, for whom permission bits do not count)."""
    import errno

    state, results = tmp_path / "s", tmp_path / "r"
    _saved_state(state, _cpu_a5_unit())
    real_open, real_access = os.open, os.access

    def read_only_open(path, flags, *args, **kwargs):
        if Path(path).parent == state and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    def read_only_access(path, mode, *args, **kwargs):
        if Path(path) == state or Path(path).parent == state:
            return not mode & os.W_OK and real_access(path, mode, *args, **kwargs)
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_open)
    monkeypatch.setattr(os, "access", read_only_access)
    with caplog.at_level("WARNING"):
        synthetic(["plan", *CPU_A5, "--results", str(results), "--state", str(state)])
        assert "| a5 length=3 gpt depth=1 d=32" in capsys.readouterr().out
        synthetic(["progress", "--state", str(state), "--results", str(results)])
        synthetic(["pack", "--state", str(state), "--out", str(tmp_path / "out")])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0] == {"progress.jsonl": 1} and lines[1]["units"] == 1
    assert caplog.text.count(f"state folder {state} is read-only here: read without its lock") == 1
    assert not (state / ".lock").exists()


def test_a_folder_that_is_not_a_results_folder_is_refused_but_one_holding_only_its_state_taken(tmp_path, monkeypatch,
                                                                                               capsys):  # fmt: skip
    """`run --results results` appended its rows beside the results folders, and `plan --results results` listed
    every unit as ready; the CPU example keeps its --state in its results folder, which a block killed before its
    first rate line leaves holding that folder alone."""
    ran = []
    monkeypatch.setattr(GridBlock, "run", lambda self: ran.append(self.results.folder))
    parent = tmp_path / "results"
    (parent / "cpu_2026-12-01").mkdir(parents=True)
    (parent / "README.md").write_text("results folders\n")
    before = _files(tmp_path)
    files = "a5.jsonl, mqar.jsonl, mad.jsonl, rates.jsonl, progress.jsonl"
    for verb in ("run", "plan"):
        for flags, but in ((["--state", str(parent / "state")], " but for the --state folder"),
                           (["--time-budget-s", "inf"], "")):  # fmt: skip
            _refused([verb, *CPU_A5, "--results", str(parent), *flags],
                     f"--results folder {parent} is not a results folder: it holds none of {files} and is not empty"
                     f"{but} (a new one must be)")  # fmt: skip
    assert _files(tmp_path) == before and ran == [] and capsys.readouterr().out == ""
    cpu = tmp_path / "synthetic_cpu"
    _saved_state(cpu / "state", _cpu_a5_unit())
    synthetic(["run", *CPU_A5, "--results", str(cpu), "--state", str(cpu / "state")])
    synthetic(["plan", *CPU_A5, "--results", str(cpu), "--state", str(cpu / "state")])
    assert ran == [cpu] and "| a5 length=3 gpt depth=1 d=32" in capsys.readouterr().out


def test_ctrl_c_stops_a_block_of_several_slots_from_starting_more_units(tmp_path, monkeypatch):
    """Ctrl-C reaches the main thread, waiting for the slots; before, the slots went on starting every unit left."""
    train = TrainSettings(steps=20, batch_size=4, aux_batch_size=2, eval_batch_size=16)
    plan = RunPlan(archs=["gpt", "kla"], families=["a5"], device="cpu", procs_per_gpu=2,
                   estimate=Estimate(tokens_per_s={"gpt": 1e4, "kla": 1e4}, overhead_s=1.0),
                   a5=A5Plan(d_model=16, num_test=8, eval_every=10, train=train,
                             stages=[A5Stage(lengths=[3, 4, 5], depths=[1], seeds=[0])]))  # fmt: skip
    block = GridBlock(plan, Results(tmp_path, ["a5"]), tmp_path / "state", "cpu", 0, False, None, "abc")
    assert block.slots == 2 and len(block.units) == 6
    started: list[str] = []
    both = threading.Barrier(2, timeout=10)

    def execute(pack, slot):  # a unit's process that the terminal's Ctrl-C ends as well
        started.append(pack[0].label())
        if len(started) <= 2 and both.wait() == 0:  # once both slots run a unit
            os.kill(os.getpid(), signal.SIGINT)  # to the main thread
        until = time.time() + 30  # (the signal reaches the main thread late on a loaded machine)
        while not getattr(block, "_stopping", False) and time.time() < until:
            time.sleep(0.01)
        raise RuntimeError("the unit's process exited with code -2")

    monkeypatch.setattr(block, "_execute", execute)
    # what a terminal's Ctrl-C does, whatever an earlier fixture of this worker left (it failed in full runs only)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    try:
        with pytest.raises(KeyboardInterrupt):
            block.run()
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    for thread in threading.enumerate():  # slots still running (before the fix) start the other units meanwhile
        if thread is not threading.main_thread() and thread.name.startswith("Thread"):
            thread.join(timeout=30)
    assert len(started) == 2 and block.failed == []  # interrupted, not failed: the next block runs them


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_pack_every_s_stopped_ends_in_one_line_and_leaves_no_half_written_piece(tmp_path, monkeypatch, capsys, how):
    """`kill $watcher` (SIGTERM) ended `pack --every-s` where it was, a piece being written left in --out as a
    temporary (.state.tar.00.tmp-...: one of the 8 files a device call returns); Ctrl-C gave a traceback, exit 1."""
    from klalm.fileio import atomic_path
    from klalm.tasks import folders

    def watch(state, out, every_s):  # stopped while it writes a piece
        out.mkdir()
        with atomic_path(out / "state.tar.00") as temporary:
            temporary.write_bytes(b"half a piece")
            assert how == "SIGINT" or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL, "SIGTERM kills pack here"
            os.kill(os.getpid(), getattr(signal, how))
            time.sleep(30)

    monkeypatch.setattr(folders, "watch_states", watch)
    (tmp_path / "state").mkdir()
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's Ctrl-C, whatever pytest set
    try:
        with pytest.raises((SystemExit, KeyboardInterrupt)) as info:
            synthetic(["pack", "--state", str(tmp_path / "state"), "--out", str(tmp_path / "out"), "--every-s", "20"])
    finally:
        signal.signal(signal.SIGINT, handler)
    assert info.type is SystemExit and info.value.code == {"SIGINT": 130, "SIGTERM": 143}[how]
    said = {"SIGINT": "interrupted", "SIGTERM": "terminated (SIGTERM)"}[how]
    assert capsys.readouterr().err == f"klalm-synthetic: pack {said}: {tmp_path / 'out'} holds the pieces packed last\n"
    assert list((tmp_path / "out").iterdir()) == [] and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_evaluate_refuses_a_device_it_cannot_use_and_curves_a_negative_step(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _refused(["evaluate", "--state", str(tmp_path / "state"), "--device", "gpu"], "--device 'gpu': Expected one of")
    _refused(["evaluate", "--state", str(tmp_path / "state"), "--device", "cuda"], "--device 'cuda': torch sees no")
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "a5.jsonl").write_bytes((COMMITTED / "a5.jsonl").read_bytes())
    _refused(["curves", "--results", str(tmp_path / "rows"), "--steps", "0,-1"], "--steps: steps must be >= 0")


def test_evaluate_refuses_a_state_it_cannot_use_in_one_line_naming_the_file(tmp_path):
    """evaluate turned only ValueError into one line: a state whose weights are another model's (saved by other
    code), whose members hold no "module" or are not a list, another .pt in a state's place, a .json whose unit this
    code's Unit does not make (a field removed, or one with a default added, since it was saved) or a file it cannot
    read ended in a traceback (RuntimeError, KeyError, TypeError, OSError)."""
    import dataclasses
    import shutil

    import torch

    from klalm.tasks import units

    unit = _cpu_a5_unit()
    name, good, plot = state_name(unit), tmp_path / "good", tmp_path / "p.png"
    members = [units.build_member(unit, seed, torch.device("cpu"), None) for seed in unit.seeds]
    units._save_state(good, unit, members, [[] for _ in unit.seeds], {"train_s": 1.0, "wall_s": 1.0, "blocks": 1})
    weights, fields = f"{name}.pt", dataclasses.asdict(unit)

    def saved_members(change):  # the .pt's members as other code saved them
        def spoil(folder: Path) -> None:
            state = torch.load(folder / weights, weights_only=True)
            torch.save({**state, "members": change(state["members"])}, folder / weights)

        return spoil

    def other_model(members: list) -> list:  # a parameter the model no longer has
        members[0]["module"]["model.old_weight"] = torch.ones(2)
        return members

    def saved_unit(changed: dict):  # the .json's unit as other code saved it
        def spoil(folder: Path) -> None:
            info = json.loads((folder / f"{name}.json").read_text())
            (folder / f"{name}.json").write_text(json.dumps({**info, "unit": changed}))

        return spoil

    cases = [
        (saved_members(other_model), weights, "holds weights that do not fit its unit's model (saved by other "
         "code?): Error(s) in loading state_dict for TokenReadout: Unexpected key(s) in state_dict: "
         '"model.old_weight"'),
        (saved_members(lambda members: [{"weights": m["module"]} for m in members]), weights,
         'holds a member without its model\'s weights (a "module" state dict; saved by other code?)'),
        (saved_members(lambda members: dict(enumerate(members))), weights,
         "is not a paused unit's state (members and evals of its 1 seed(s), spent)"),  # not a list
        (lambda folder: torch.save({"weights": torch.ones(2)}, folder / weights), weights,
         "is not a paused unit's state (members and evals of its 1 seed(s), spent)"),
        (saved_unit({**fields, "old_field": 1}), f"{name}.json", "holds no unit this code knows (saved by other "
         "code?): Unit.__init__() got an unexpected keyword argument 'old_field'"),
        (saved_unit({k: v for k, v in fields.items() if k != "eval_every"}), f"{name}.json",
         "holds a unit that this code saves as "),  # eval_every: its default, None, names another state
        (lambda folder: (folder / "other.json").mkdir(), "other.json", "Is a directory"),
    ]  # fmt: skip
    for index, (spoil, file, message) in enumerate(cases):
        folder = tmp_path / str(index)
        shutil.copytree(good, folder)
        spoil(folder)
        said = _refused(["evaluate", "--state", str(folder), "--plot", str(plot)], message)
        assert str(folder / file) in said, said
    assert not plot.exists()


def _cpu_a5_plan(knobs: list[str] = CPU_A5) -> RunPlan:
    from klalm.cli.synthetic_args import parse_args
    from klalm.tasks.plans import apply_args, load_plan

    args = parse_args(["run", *knobs, "--results", "x"])
    return apply_args(load_plan(args.plan), args)


def _plan_units(knobs: list[str]):
    from klalm.tasks.plans import plan_units

    return plan_units(_cpu_a5_plan(knobs))


def _cpu_a5_unit():
    """The one unit of CPU_A5 (gpt, length 3, depth 1)."""
    return _plan_units(CPU_A5)[0]


def _saved_state(folder: Path, unit) -> None:
    """A state of `unit` paused at step 5, as units._save_state writes one (no weights: nothing loads them here)."""
    import dataclasses

    import torch

    from klalm.tasks.units import state_name

    folder.mkdir(parents=True, exist_ok=True)
    name = state_name(unit)
    torch.save(
        {"members": [{} for _ in unit.seeds], "evals": [[] for _ in unit.seeds], "spent": {}}, folder / f"{name}.pt"
    )
    info = {"unit": dataclasses.asdict(unit), "label": unit.label(), "step": 5, "spent": {}}
    (folder / f"{name}.json").write_text(json.dumps(info))


def test_plan_keeps_the_state_of_a_unit_finished_meanwhile(tmp_path, capsys):
    """`plan` records nothing: the state a block would drop (its unit's rows came from elsewhere) stays. It reads the
    state folder under its lock, as every reader does, whose empty file it makes where no save has made it yet."""
    unit = _cpu_a5_unit()
    (tmp_path / "r").mkdir()
    rows = [{**unit.cell(), "seed": seed, "token_acc": 0.5, "seq_acc": 0.0, "steps": 20}
            for seed in unit.seeds]  # fmt: skip
    (tmp_path / "r" / "a5.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    _saved_state(tmp_path / "s", unit)
    before = _files(tmp_path)
    synthetic(["plan", *CPU_A5, "--results", str(tmp_path / "r"), "--state", str(tmp_path / "s")])
    assert "| done |" in capsys.readouterr().out
    assert _files(tmp_path) == {**before, "s/.lock": b""}
    block = GridBlock(_cpu_a5_plan(), Results(tmp_path / "r", ["a5"]), tmp_path / "s", "cpu", 0, True, None, "abc")
    assert block.saved() == {}  # a block does drop it: the state above is a stale one


def test_a_state_saved_under_other_members_or_steps_is_named_before_its_seeds_restart(tmp_path, capsys, caplog):
    """A paused unit's state saved under other --members or --steps matches no unit of the plan (its name digests the
    unit's seeds and steps): it was ignored without a word and its seeds trained again from step 0."""
    two = ["--seeds", "0,1"]
    (unit,) = _plan_units([*CPU_A5, *two, "--members", "2"])
    _saved_state(tmp_path / "s", unit)
    state = f"{tmp_path / 's' / state_name(unit)}.json ({unit.label()}, paused at step 5) is resumed by no unit of this"
    plan = ["plan", *CPU_A5, "--results", str(tmp_path / "r"), "--state", str(tmp_path / "s"), *two]
    for knobs, differs in (
        ([], "seeds [0, 1] side by side there, [0] and [1] in the plan (--members, or rows of"),
        (["--members", "2", "--steps", "50"], "300 steps there, 50 in the plan (--steps)"),
    ):
        synthetic([*plan, *knobs])
        assert f"{state} plan: {differs}" in capsys.readouterr().out
    synthetic([*plan, "--members", "2"])  # the knobs it ran with: it resumes
    assert "| resumes |" in capsys.readouterr().out
    synthetic([*plan, "--a5-lengths", "5"])  # another cell's state: not this plan's business
    assert "resumed by no unit" not in capsys.readouterr().out
    with caplog.at_level("WARNING", logger="klalm.synthetic"):
        synthetic(["run", *plan[1:], "--time-budget-s", "0"])
    assert f"{state} plan: seeds [0, 1] side by side there" in caplog.text


@pytest.mark.parametrize("budget", ["-10", "-1e3", "0", "-inf"])
def test_a_time_budget_of_0_or_below_starts_nothing_and_exits_0(tmp_path, monkeypatch, caplog, budget):
    """A late stage of a device call computes its budget without a floor: at 0 or below it is skipped, not failed;
    0 is no time left, not "no deadline" (leaving the flag out is)."""

    def execute(self, pack, slot):
        raise AssertionError("a unit started with no time left")

    monkeypatch.setattr(GridBlock, "_execute", execute)
    with caplog.at_level("INFO", logger="klalm.synthetic"):
        synthetic(["run", *CPU_A5, "--results", str(tmp_path / "r"), "--state", str(tmp_path / "s"), "--time-budget-s",
              budget])  # fmt: skip
    assert "deadline in none" not in caplog.text
    assert "no time left" in caplog.text and "block done: 0 rows written" in caplog.text
    assert not (tmp_path / "r" / "a5.jsonl").exists()
    synthetic(["plan", *CPU_A5, "--results", str(tmp_path / "r"), "--time-budget-s", budget])  # plan has no deadline


def test_a_time_budget_of_inf_is_no_deadline_and_needs_no_state(tmp_path, monkeypatch):
    """The cpu plan's time_budget_s (720) needs --state; `--time-budget-s inf` runs it without a deadline."""
    deadlines = []
    monkeypatch.setattr(GridBlock, "run", lambda self: deadlines.append(self.deadline))
    synthetic(["run", *CPU_A5, "--results", str(tmp_path / "r"), "--time-budget-s", "inf"])
    assert deadlines == [None]


def test_ctrl_c_names_the_units_that_failed_before_it(tmp_path, monkeypatch, capsys):
    def fails_then_interrupted(self):
        self.failed.append((self.units[0], "RuntimeError: the unit's process exited with code 1"))
        raise KeyboardInterrupt

    monkeypatch.setattr(GridBlock, "run", fails_then_interrupted)
    with pytest.raises(SystemExit) as info:
        synthetic(["run", *CPU_A5, "--results", str(tmp_path / "r"), "--state", str(tmp_path / "s")])
    assert info.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    failure = f"  {_cpu_a5_unit().label()}: RuntimeError: the unit's process exited with code 1"
    assert err[-3:-1] == ["[synthetic] 1 unit(s) failed:", failure]
    assert err[-1].startswith("klalm-synthetic: interrupted: 0 row(s) written")


def test_merge_restores_the_states_of_a_call_whose_results_did_not_come_back(tmp_path, capsys):
    from klalm.tasks.states import pack_states, saved_states

    unit = _cpu_a5_unit()
    _saved_state(tmp_path / "paused", unit)
    call = tmp_path / "call"  # what came back: the state parts, and synthetic/ without results files
    pack_states(tmp_path / "paused", call)
    (call / "synthetic").mkdir()  # (or none at all: the next test)
    (tmp_path / "dest").mkdir()
    state = tmp_path / "state"
    synthetic(["merge", "--from", str(call / "synthetic"), "--results", str(tmp_path / "dest"), "--state", str(state)])
    assert json.loads(capsys.readouterr().out)["state"] == {"units": 1, "mib": 0.0}
    assert list(saved_states(state)) == list(saved_states(tmp_path / "paused"))
    merge = ["merge", "--from", str(call / "synthetic"), "--results", str(tmp_path / "dest")]
    _refused(merge, "holds no results file (*.jsonl): nothing to merge")  # no --state: nothing to do
    (tmp_path / "bare" / "synthetic").mkdir(parents=True)
    _refused(["merge", "--from", str(tmp_path / "bare" / "synthetic"), "--results", str(tmp_path / "dest"), "--state",
              str(tmp_path / "state_bare")], "(*.jsonl) and no state.tar.* parts lie beside it")  # fmt: skip
    _refused(["merge", "--from", str(tmp_path / "bare" / "none"), "--results", str(tmp_path / "dest"), "--state",
              str(tmp_path / "state_bare")], "does not exist")  # fmt: skip
    assert not (tmp_path / "state_bare").exists()


def test_merge_refuses_a_state_of_other_code_before_it_merges_a_row_or_swaps_a_state(tmp_path):
    """A state whose .json's unit this code's Unit does not make (a field added, or one it needs removed, since it was
    saved) was read for its progress rows after the rows were merged and the states swapped in, and the --results
    folder's progress.jsonl, where those rows go, was read then too: a ValueError traceback, the folders half updated.
    Both are refused in one line, as `progress` and `evaluate` refuse them, nothing changed."""
    import dataclasses

    from klalm.tasks.states import pack_states

    unit = _cpu_a5_unit()
    name, fields = state_name(unit), dataclasses.asdict(unit)
    call, dest, state = tmp_path / "call", tmp_path / "dest", tmp_path / "state"
    (call / "synthetic").mkdir(parents=True)
    rows = (COMMITTED / "a5.jsonl").read_text().splitlines()
    (call / "synthetic" / "a5.jsonl").write_text(rows[1] + "\n")  # a new row
    dest.mkdir()
    (dest / "a5.jsonl").write_text(rows[0] + "\n")
    _saved_state(state, _plan_units([*CPU_A5, "--a5-lengths", "5"])[0])  # the state a good merge would replace
    before = {"dest": _files(dest), "state": _files(state)}
    merge = ["merge", "--from", str(call / "synthetic"), "--results", str(dest), "--state", str(state)]
    for changed, why in (
        ({**fields, "old_field": 1}, "unexpected keyword argument 'old_field'"),
        ({k: v for k, v in fields.items() if k != "num_test"}, "missing 1 required positional argument: 'num_test'"),
    ):
        _saved_state(tmp_path / "paused", unit)
        info = json.loads((tmp_path / "paused" / f"{name}.json").read_text())
        (tmp_path / "paused" / f"{name}.json").write_text(json.dumps({**info, "unit": changed}))
        pack_states(tmp_path / "paused", call)
        said = _refused(merge, why)
        archive = "klalm-synthetic: state archive state.tar.00 holds a state this code cannot read: "
        assert said.startswith(f"{archive}state file {name}.json holds no unit this code knows (saved by other code?)")
        assert said.endswith(f"(kept {state})")
        assert {"dest": _files(dest), "state": _files(state)} == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["call", "dest", "paused", "state"]  # no staging left
    _saved_state(tmp_path / "paused", unit)  # a good state, and a progress.jsonl cut short
    pack_states(tmp_path / "paused", call)
    (dest / "progress.jsonl").write_text('{"family": "a5", "ta\n')
    before = {"dest": _files(dest), "state": _files(state)}
    _refused(merge, f"{dest / 'progress.jsonl'}:1: not a JSON row")
    assert {"dest": _files(dest), "state": _files(state)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["call", "dest", "paused", "state"]


def test_merge_of_a_missing_synthetic_folder_restores_the_parts_beside_it_and_refuses_a_typo(tmp_path, capsys):
    """A call whose results files all stayed behind returns no synthetic/ folder (the device tool returns files, not
    folders): its parts are restored. A typo in --from (`synthetc`) must not restore them unnoticed."""
    from klalm.tasks.states import pack_states

    _saved_state(tmp_path / "paused", _cpu_a5_unit())
    call = tmp_path / "call"
    pack_states(tmp_path / "paused", call)
    (tmp_path / "dest").mkdir()
    typo = call / "synthetc"
    _refused(["merge", "--from", str(typo), "--results", str(tmp_path / "dest"), "--state", str(tmp_path / "state")],
             f"--from folder {typo} does not exist")  # fmt: skip
    assert not (tmp_path / "state").exists() and _files(tmp_path / "dest") == {} and not typo.exists()
    synthetic(["merge", "--from", str(call / "synthetic"), "--results", str(tmp_path / "dest"), "--state",
          str(tmp_path / "state")])  # fmt: skip
    assert json.loads(capsys.readouterr().out)["state"] == {"units": 1, "mib": 0.0}
    assert not (call / "synthetic").exists() and list(_files(tmp_path / "dest")) == ["progress.jsonl"]  # the pause


# -- signals: the units' processes run in sessions of their own, and the runner passes on one SIGINT ----------------

CHILD = """
import os, signal, sys, time
from pathlib import Path
notes = Path(sys.argv[1]) / f"{os.getpid()}.child"
def note(what):
    with open(notes, "a") as f:
        f.write(what + "\\n")
def on_sigint(signum, frame):
    note("SIGINT")
    raise KeyboardInterrupt
signal.signal(signal.SIGINT, on_sigint)
note("started" + (" in the runner's process group" if os.getpgrp() == os.getpgid(os.getppid()) else ""))
try:
    time.sleep(60)
except KeyboardInterrupt:
    time.sleep(0.5)  # unwinding, as a unit does: a second SIGINT now ends it with a traceback
    note("exit 130")
    sys.exit(130)
"""

RUNNER = """
import signal, subprocess, sys, types
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # also when the tests run with SIGINT ignored
from klalm.cli import synthetic
from klalm.tasks import runner
from klalm.tasks.cells import TrainSettings
from klalm.tasks.plans import A5Plan, A5Stage, Estimate, RunPlan
folder, child = Path(sys.argv[1]), sys.argv[2]
def popen(command, **kwargs):  # the unit's process, started as the runner starts it, runs `child`
    return subprocess.Popen([sys.executable, "-c", child, str(folder)], **kwargs)
runner.subprocess = types.SimpleNamespace(Popen=popen, TimeoutExpired=subprocess.TimeoutExpired)
train = TrainSettings(steps=20, batch_size=4, aux_batch_size=2, eval_batch_size=16)
plan = RunPlan(archs=["gpt", "kla"], families=["a5"], device="cpu", procs_per_gpu=2,
               estimate=Estimate(tokens_per_s={"gpt": 1e4, "kla": 1e4}, overhead_s=1.0),
               a5=A5Plan(d_model=16, num_test=8, eval_every=10, train=train,
                         stages=[A5Stage(lengths=[3, 4, 5], depths=[1], seeds=[0])]))
runner.load_plan = lambda name: plan
synthetic(["run", "--plan", "tiny", "--results", str(folder / "r"), "--state", str(folder / "s")])
"""


def _notes(folder: Path) -> dict[int, list[str]]:
    return {int(p.name.split(".")[0]): p.read_text().splitlines() for p in folder.glob("*.child")}


def _started(folder: Path) -> int:
    return sum(bool(lines) and lines[0].startswith("started") for lines in _notes(folder).values())


def _kill_all(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_and_sigterm_reach_each_units_process_once(tmp_path, how):
    """Ctrl-C: the terminal signals the runner's process group; SIGTERM (`timeout`): the runner alone. Either way
    each unit's process gets one SIGINT (a second one, while it unwinds, ended it with a traceback and -2) and
    ends; the runner starts nothing more and ends with its one line."""
    import subprocess
    import sys

    env = {**os.environ, "KLALM_COMMIT": "abc"}
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path), CHILD], start_new_session=True, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        until = time.time() + 60  # both units' processes have noted their start (a note file exists a moment before
        while _started(tmp_path) < 2 and runner.poll() is None and time.time() < until:  # it holds its line)
            time.sleep(0.05)
        assert _started(tmp_path) == 2, runner.communicate(timeout=30)
        if how == "ctrl-c":
            os.killpg(runner.pid, signal.SIGINT)
        else:
            runner.send_signal(signal.SIGTERM)
        _, err = runner.communicate(timeout=60)
        notes = _notes(tmp_path)  # nothing more started; in their own sessions, one SIGINT each
        assert list(notes.values()) == [["started", "SIGINT", "exit 130"]] * 2, (notes, err)
        assert runner.returncode == (130 if how == "ctrl-c" else 143), err
        said = "interrupted: " if how == "ctrl-c" else "terminated (SIGTERM): "
        assert err.strip().splitlines()[-1].startswith(f"klalm-synthetic: {said}")
        assert "failed" not in err
    finally:
        _kill_all([runner.pid, *_notes(tmp_path)])


def test_stop_signals_every_process_once_and_waits_for_them_together(tmp_path):
    """Processes that ignore SIGINT are killed after one shared wait, not one wait each."""
    import subprocess
    import sys

    block = GridBlock(_cpu_a5_plan(), Results(tmp_path, ["a5"]), tmp_path / "s", "cpu", 0, False, None, "abc")
    stubborn = "import signal, time\nsignal.signal(signal.SIGINT, lambda *_: print('SIGINT', flush=True))\n" \
               "print('ready', flush=True)\ntime.sleep(60)"  # fmt: skip
    children = [subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE, text=True)
                for _ in range(3)]  # fmt: skip
    try:
        assert [child.stdout.readline() for child in children] == ["ready\n"] * 3
        block._children.update(children)
        started = time.monotonic()
        block.stop(wait_s=1.0)
        block.stop(wait_s=1.0)  # again (the main thread's slot, then the block): no second SIGINT
        assert time.monotonic() - started < 2.5  # one wait of 1 s for all three (one each: 3 s)
        assert [child.returncode for child in children] == [-signal.SIGKILL] * 3
        assert [child.stdout.read() for child in children] == ["SIGINT\n"] * 3
        assert block._stopping
    finally:
        _kill_all(child.pid for child in children)


def test_a_units_process_starts_in_its_own_session_and_not_once_the_block_stops(tmp_path, monkeypatch):
    import types

    from klalm.tasks import runner

    started = []

    class Exited:
        pid = 12345

        def wait(self, timeout=None):
            return 1

    def popen(command, **kwargs):
        started.append((command, kwargs))
        return Exited()

    monkeypatch.setattr(runner, "subprocess", types.SimpleNamespace(Popen=popen, TimeoutExpired=TimeoutError))
    block = GridBlock(_cpu_a5_plan(), Results(tmp_path, ["a5"]), tmp_path / "s", "cpu", 0, False, None, "abc")
    with pytest.raises(RuntimeError, match="exited with code 1"):
        block._execute([block.units[0]], 0)
    ((command, kwargs),) = started
    assert kwargs["start_new_session"] is True  # the terminal's Ctrl-C reaches the runner alone
    assert command[command.index("--runner-pid") + 1] == str(os.getpid())  # the unit ends when the runner is gone
    assert block._children == set()
    claims = iter([[block.units[0]], None])

    def claim():  # a slot that claimed a pack just before the Ctrl-C
        pack = next(claims)
        block.running.extend(pack or [])
        return pack

    monkeypatch.setattr(block, "_claim", claim)
    block._stopping = True
    block._slot(0)
    assert len(started) == 1 and block.failed == []  # not started, and not a failure


def test_a_units_process_ends_once_the_runner_is_killed(tmp_path):
    """SIGKILL of the runner (`timeout -k`, the machine's limit) reaches no unit's process, in its own session."""
    import subprocess
    import sys

    unit = "import sys, time\nfrom klalm.tasks.units import exit_with_runner\nexit_with_runner(int(sys.argv[1]), " \
           "0.05)\nprint('watching', flush=True)\ntime.sleep(60)"  # fmt: skip
    runner = f"import os, subprocess, sys, time\np = subprocess.Popen([sys.executable, '-c', {unit!r}, " \
             "str(os.getpid())], start_new_session=True)\nprint(p.pid, flush=True)\ntime.sleep(60)"  # fmt: skip
    process = subprocess.Popen([sys.executable, "-c", runner], stdout=subprocess.PIPE, text=True)
    pid = int(process.stdout.readline())
    try:
        assert process.stdout.readline() == "watching\n"
        process.kill()
        process.wait()
        started = time.monotonic()
        assert process.stdout.read() == ""  # the pipe ends: the unit's process, its last writer, has ended
        assert time.monotonic() - started < 5
    finally:
        _kill_all([pid])


def test_a_second_sigterm_while_the_block_stops_is_ignored(tmp_path):
    """The handler marks the block stopping at once: `timeout` also signals the group, and a second Terminated raised
    inside the first one's handling skipped the units' SIGINT and the progress record."""
    from klalm.tasks.folders import Terminated

    block = GridBlock(_cpu_a5_plan(), Results(tmp_path, ["a5"]), tmp_path / "s", "cpu", 0, False, None, "abc")
    with pytest.raises(Terminated):
        block._terminated(signal.SIGTERM, None)
    assert block._stopping
    block._terminated(signal.SIGTERM, None)  # no second Terminated


def test_a_units_process_hears_sigint_even_when_started_with_it_ignored(tmp_path, monkeypatch):
    """A runner started as `cmd &` by a script has SIGINT ignored, and its processes inherit that: the runner's one
    SIGINT was then ignored and every unit waited out the 30 s before its kill."""
    from klalm.tasks import units

    monkeypatch.setattr(units, "exit_with_runner", lambda pid: None)  # no watching thread in the test process
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(FileNotFoundError):  # the handler is set before the unit file is read
            units.main(["--unit", str(tmp_path / "none.json"), "--out", str(tmp_path / "o.json"), "--device", "cpu",
                        "--runner-pid", "1"])  # fmt: skip
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
