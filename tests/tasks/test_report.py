"""klalm.tasks.report: minimum-depth readings (unfinished cells shown as such), MQAR's partial cells, the generated
sections of docs/synthetic.md, and that the committed document is what the committed results produce."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from klalm.tasks import report
from klalm.tasks.plans import A5Stage, load_plan, plan_units
from klalm.tasks.report import min_depth, sections, write_doc, write_folder

REPO = Path(__file__).resolve().parents[2]


def _runs(*accs):
    return [{"token_acc": a} for a in accs]


@pytest.mark.parametrize(
    ("depths", "expected"),
    [
        ({1: (3, _runs(0.2, 0.95)), 2: (3, [])}, ("1", "solved")),
        ({1: (3, _runs(0.2, 0.3, 0.1)), 2: (3, _runs(0.5, 0.91))}, ("2", "solved")),
        ({1: (3, _runs(0.2)), 2: (3, _runs(0.91))}, ("≤2", "solved")),  # depth 1 unfinished
        ({1: (3, _runs(0.2, 0.3, 0.1)), 2: (3, _runs(0.5, 0.5, 0.5))}, (">2", "unsolved")),
        ({1: (3, _runs(0.2, 0.3, 0.1)), 2: (3, _runs(0.5)), 3: (3, [])}, (">1 …", "unfinished")),
        ({1: (3, _runs(0.2)), 2: (3, [])}, ("…", "unfinished")),
        ({1: (3, []), 2: (3, [])}, ("not run", "open")),
        ({1: (3, _runs(0.9))}, ("1", "solved")),  # the threshold itself counts
    ],
    ids=["d1", "d2", "le2", "gt2", "gt1-open", "open-partial", "not-run", "at-threshold"],
)
def test_min_depth_readings(depths, expected):
    assert min_depth(depths, "token_acc", 0.9) == expected


def _plan():
    plan = load_plan("full")
    plan.families, plan.archs = ["a5", "mqar"], ["kla", "gpt"]
    plan.a5.stages = [A5Stage(lengths=[4, 8], depths=[1, 2], seeds=[0, 1, 2])]
    return plan


def _write(folder: Path, family: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{family}.jsonl", "a") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in rows)


def _row(unit, seed, acc):
    return {**unit.cell(), "seed": seed, "token_acc": acc, "seq_acc": acc / 2, "steps": 500}


def test_sections_show_results_and_unfinished_cells(tmp_path):
    plan = _plan()
    units = plan_units(plan)
    kla4 = next(u for u in units if (u.arch, u.task.get("length"), u.n_layers) == ("kla", 4, 1))
    gpt4 = [u for u in units if u.family == "a5" and u.arch == "gpt" and u.task["length"] == 4]
    mqar = [u for u in units if u.family == "mqar" and u.arch == "kla" and u.task["length"] == 64][:3]
    _write(tmp_path, "a5", [_row(kla4, 0, 0.97), _row(kla4, 1, 0.4), _row(kla4, 2, 0.3)])
    _write(tmp_path, "a5", [_row(gpt4[0], s, 0.2) for s in range(3)] + [_row(gpt4[1], 0, 0.5)])
    _write(tmp_path, "mqar", [_row(u, 0, acc) for u, acc in zip(mqar, (0.1, 0.6, 0.3))])
    text = sections(plan, tmp_path, tmp_path, "")
    assert "| kla | 1 (97.0) | not run |" in text["a5"]
    assert "| gpt | >1 … (50.0) | not run |" in text["a5"]
    assert "| kla | 4 | 1 | 3/3 | 0 | 97.0 | 48.5 | — | 500 |" in text["a5"]  # no accuracy by position recorded
    assert "| gpt | 4 | 2 | 1/3 | none | 50.0 | 25.0 | — | 500 |" in text["a5"]
    lr = mqar[1].train.lr
    assert f"| kla, 2 blocks, d=64 | 60.0 (lr {lr:g}) (3/4) | not run | not run | not run |" in text["mqar"]
    assert "| gpt, 2 blocks, d=64 | not run |" in text["mqar"] and "L=2048 K=256" in text["mqar"]
    assert (tmp_path / "synthetic_a5.png").stat().st_size > 1000
    markdown = write_folder(plan, tmp_path, tmp_path / "out")
    assert "## a5" in markdown and (tmp_path / "out" / "synthetic_mqar.png").is_file()


def test_paused_units_show_their_progress_as_unfinished(tmp_path):
    plan = _plan()
    kla8 = next(u for u in plan_units(plan) if (u.arch, u.task.get("length"), u.n_layers) == ("kla", 8, 1))
    paused = [{**_row(kla8, s, acc), "steps": 700, "evals": [[500, 1.0, acc - 0.1, 0.0], [700, 0.9, acc, 0.1]]}
              for s, acc in ((0, 0.6), (1, 0.5))]  # fmt: skip
    older = {**paused[0], "steps": 500, "evals": paused[0]["evals"][:1]}
    _write(tmp_path, "progress", [older, *paused])
    text = sections(plan, tmp_path, tmp_path, "")["a5"]
    assert "| kla | not run | … (paused: 60.0) |" in text  # L=4 not run; L=8 unfinished, best so far 60 %
    assert "| kla | 8 | 1 | 0/3, 2 paused | none yet | 60.0 | 10.0 | — | paused at 700 of 100000 |" in text
    by_position = [1.0, 0.95, None, 0.9, 0.5, 0.9, 0.0, 0.0]  # reach 4: position 2 is not scored, 4 is below 90 %
    _write(tmp_path, "a5", [{**_row(kla8, 0, 0.65), "position_acc": by_position}])  # seed 0 finished since
    assert "| kla | 8 | 1 | 1/3, 1 paused | none yet | 50.0 | 10.0 | — | paused at 700 of 100000 |" in sections(
        plan, tmp_path, tmp_path, "")["a5"]  # fmt: skip
    assert "| kla | 8 | 1 | 1/3 | none | 65.0 | 32.5 | 4 | 500 |" in sections(plan, tmp_path, tmp_path, "")["a5"]
    restarted = {**paused[1], "steps": 200, "evals": [[200, 1.5, 0.3, 0.0]]}  # seed 1's state was lost: from step 0
    _write(tmp_path, "progress", [restarted])  # appended after the rows above
    assert "| kla | 8 | 1 | 1/3, 1 paused | none yet | 30.0 | 0.0 | — | paused at 200 of 100000 |" in sections(
        plan, tmp_path, tmp_path, "")["a5"]  # the row recorded last, not the one of most steps  # fmt: skip


def test_write_folder_replaces_results_md_whole_or_not_at_all(tmp_path, monkeypatch):
    """`report --out` wrote results.md in place: a write cut short (a full disk, a kill) left part of a table over
    the last report."""
    monkeypatch.setattr(report, "sections", lambda plan, folder, image_dir, prefix: {"a5": "| the new table |"})
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.md").write_text("## a5\n\n| the last report |\n")

    def cut_short(path, data, **kwargs):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(data[:4])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", cut_short)
    with pytest.raises(OSError, match="No space left"):
        write_folder(_plan(), tmp_path, out)
    monkeypatch.undo()
    assert [p.name for p in out.iterdir()] == ["results.md"]
    assert (out / "results.md").read_text() == "## a5\n\n| the last report |\n"


def test_write_doc_fills_only_the_marked_sections(tmp_path):
    plan = _plan()
    doc = tmp_path / "doc.md"
    doc.write_text("prose\n<!-- synthetic:a5 -->\nSTALE\n<!-- /synthetic:a5 -->\nmiddle\n"
                   "<!-- synthetic:mqar -->\n<!-- /synthetic:mqar -->\nend\n")  # fmt: skip
    (tmp_path / "empty").mkdir()
    write_doc(plan, tmp_path / "empty", doc)
    text = doc.read_text()
    assert text.startswith("prose\n<!-- synthetic:a5 -->\nA5, minimum blocks") and "middle\n" in text
    assert "STALE" not in text and "| kla | not run | not run |" in text and text.endswith("end\n")
    plan.families = ["a5", "mad"]
    with pytest.raises(ValueError, match="synthetic:mad"):
        write_doc(plan, tmp_path / "empty", doc)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        sections(plan, tmp_path / "nowhere", tmp_path, "")


def test_docs_synthetic_md_is_what_the_committed_results_produce(tmp_path):
    """No generated number in docs/synthetic.md is typed by hand or out of date: `report --doc` changes nothing."""
    doc = tmp_path / "docs" / "synthetic.md"
    doc.parent.mkdir()
    shutil.copy(REPO / "docs" / "synthetic.md", doc)
    write_doc(load_plan("full"), REPO / "results" / "synthetic", doc)
    assert doc.read_text() == (REPO / "docs" / "synthetic.md").read_text()
    for png in (tmp_path / "docs" / "img").glob("*.png"):
        assert (REPO / "docs" / "img" / png.name).is_file(), png.name


def test_paused_mqar_units_show_how_far_they_got(tmp_path):
    plan = _plan()
    mqar = [u for u in plan_units(plan) if u.family == "mqar" and u.arch == "kla" and u.task["length"] == 64][:2]
    planned_steps = mqar[0].train.steps
    paused = [{**_row(u, 0, 0.0), "token_acc": None, "seq_acc": None, "steps": 300, "planned_steps": planned_steps,
               "evals": []} for u in mqar]  # fmt: skip
    _write(tmp_path, "progress", paused)  # MQAR evaluates only at the end: nothing measured yet
    text = sections(plan, tmp_path, tmp_path, "")["mqar"]
    assert f"| kla, 2 blocks, d=64 | … (paused at 300 of {planned_steps}) |" in text
    _write(tmp_path, "progress", [{**paused[1], "steps": 400, "token_acc": 0.25, "evals": [[400, 2.0, 0.25, 0.0]]}])
    assert f"| kla, 2 blocks, d=64 | … (paused at 300 of {planned_steps}: 25.0) |" in sections(
        plan, tmp_path, tmp_path, "")["mqar"]  # fmt: skip
    _write(tmp_path, "mqar", [_row(mqar[0], 0, 0.5)])  # one learning rate finished since
    lr = mqar[0].train.lr
    text = sections(plan, tmp_path, tmp_path, "")["mqar"]
    assert f"| kla, 2 blocks, d=64 | 50.0 (lr {lr:g}) (1/4, 1 paused) |" in text
    _write(tmp_path, "mqar", [_row(mqar[0], 0, 0.5), {**_row(mqar[1], 0, 0.995), "ended": "threshold", "steps": 3128}])
    text = sections(plan, tmp_path, tmp_path, "")["mqar"]  # a run the stop rule ended says when
    assert f"| kla, 2 blocks, d=64 | 99.5 (lr {mqar[1].train.lr:g}, stopped at 3,128 steps) (2/4) |" in text, text


def test_mqar_position_tables_name_a_kla_d_state():
    overrides = {"mixer_options": {"kla": {"block": "plain", "d_state": 4}}}
    row = {"arch": "kla", "task": {"name": "mqar", "length": 32, "num_pairs": 8}, "n_layers": 1, "d_model": 64,
           "train": {"lr": 3e-3}, "model_overrides": overrides}  # fmt: skip
    assert report._position_unit(row) == "kla L=32 K=8 depth=1 d=64 S=4 lr=0.003"
    default = {**row, "model_overrides": {"mixer_options": {"kla": {"block": "plain"}}}}
    assert report._position_unit(default) == "kla L=32 K=8 depth=1 d=64 lr=0.003"


def test_a5_positions_plot_counts_a_units_paused_seeds_in_its_legend(tmp_path, monkeypatch):
    """A unit's line is its best seed with the range of all its seeds; paused ones (at their last evaluation) are
    counted apart in the legend."""
    legends = []

    def capture(fig, path, **savefig):  # instead of writing the figure: its legends
        legends.append([t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()])

    def row(seed, ended):
        return {"task": {"name": "a5", "length": 3}, "arch": "kla", "n_layers": 1, "seed": seed, "ended": ended,
                "token_acc": 0.5, "position_acc": [1.0, 0.5, 0.0]}  # fmt: skip

    monkeypatch.setattr(report, "save_figure", capture)
    report.plot_positions([row(0, "steps"), row(1, "paused"), row(2, "paused")], tmp_path / "p.png")
    report.plot_positions([row(0, "steps")], tmp_path / "p.png")
    assert legends == [["kla, 1 block (3 seeds, 2 paused)"], ["kla, 1 block (1 seeds)"]]


def test_a_line_of_the_grid_plots_breaks_where_a_column_has_no_finished_run(tmp_path, monkeypatch):
    """MQAR's plot: a column without a finished run is a gap (NaN) in its line, not a segment drawn across it
    (MAD's plot once joined in-context recall to compression over three tasks that never ran); cells hold (finished
    rows, planned runs, paused rows), as `best_runs` makes them."""
    import math

    lines = {}

    def capture(fig, path, **savefig):  # instead of writing the figure: each line's points
        lines.update({line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in fig.axes[0].lines})

    cells = {("kla", "a"): ([{"token_acc": 0.5}, {"token_acc": 0.75}], 2, []), ("kla", "b"): ([], 1, []),
             ("kla", "d"): ([{"token_acc": 1.0}], 1, []), ("gpt", "c"): ([{"token_acc": 0.25}], 1, [])}  # fmt: skip
    monkeypatch.setattr(report, "save_figure", capture)
    report.plot_lines(cells, "MAD-Lab", tmp_path / "p.png")
    xs, ys = lines["kla"]
    assert xs == [0, 1, 2, 3]  # the columns in the order they first appear: a, b, d, c
    assert ys[0] == 75.0 and math.isnan(ys[1]) and ys[2] == 100.0 and math.isnan(ys[3])
    assert [math.isnan(y) for y in lines["gpt"][1]] == [True, True, True, False] and lines["gpt"][1][3] == 25.0


def test_the_mad_plot_draws_bars_only_where_a_run_finished_and_marks_tasks_never_run(tmp_path, monkeypatch):
    """MAD's tasks are not a scale, so its plot is grouped bars: one per arch and task with a finished run (the best
    accuracy), no bar (not a 0 % one) where an arch has none, and "not run" under a task no arch has finished."""
    drawn = {}

    def capture(fig, path, **savefig):  # instead of writing the figure: each arch's bars and the texts
        ax = fig.axes[0]
        for container in ax.containers:
            drawn[container.get_label()] = [round(bar.get_height(), 6) for bar in container]
        drawn["texts"] = [(round(t.get_position()[0]), t.get_text()) for t in ax.texts]

    cells = {("kla", "a"): ([{"token_acc": 0.5}, {"token_acc": 0.75}], 2, []), ("gpt", "a"): ([], 1, []),
             ("kla", "b"): ([], 1, []), ("gpt", "b"): ([], 1, []),
             ("kla", "c"): ([{"token_acc": 1.0}], 1, []), ("gpt", "c"): ([{"token_acc": 0.25}], 1, [])}  # fmt: skip
    monkeypatch.setattr(report, "save_figure", capture)
    report.plot_bars(cells, "MAD-Lab", tmp_path / "p.png")
    assert drawn["kla"] == [75.0, 100.0] and drawn["gpt"] == [25.0]
    assert drawn["texts"] == [(1, "not run")]


def test_a_figure_cut_off_mid_write_leaves_the_old_image_whole(tmp_path, savefig_cut_off):
    """A report's PNGs were written in place: a kill mid-write left a truncated image that results.md links to. The
    figure is closed all the same (pyplot kept it)."""
    import matplotlib.pyplot as plt

    (tmp_path / "a5.png").write_bytes(b"old image")
    open_before = plt.get_fignums()
    with pytest.raises(OSError, match="cut off mid-write"), report._figure(tmp_path / "a5.png"):
        pass
    assert (tmp_path / "a5.png").read_bytes() == b"old image" and plt.get_fignums() == open_before
    assert [p.name for p in tmp_path.iterdir()] == ["a5.png"]


def test_a_plot_whose_drawing_fails_closes_its_figure_and_writes_nothing(tmp_path, monkeypatch):
    """A report figure was closed by its save alone: one whose drawing failed before it (rows of a shape the plot
    did not expect) stayed open in pyplot, which keeps every figure until closed, one more at each failure."""
    import matplotlib.pyplot as plt
    from matplotlib.axes import Axes

    def fails(self, *args, **kwargs):
        raise ValueError("drawing failed")

    a5 = {"task": {"name": "a5", "length": 3}, "arch": "kla", "n_layers": 1, "seed": 0, "unit": "kla L=3 depth=1",
          "ended": "steps", "token_acc": 0.5, "position_acc": [1.0, 0.5, 0.0],
          "evals": [[10, 1.0, 0.5, 0.0]]}  # fmt: skip
    mqar = {**a5, "task": {"name": "mqar", "length": 4, "num_pairs": 1}, "position_acc": [None, None, None, 1.0]}
    cells = {("kla", "a"): ([{"token_acc": 0.5}], 1, [])}
    plots = [lambda path: report.plot_a5({("kla", 3): ("1", "solved")}, [3], 2, _plan(), path),
             lambda path: report.plot_lines(cells, "MQAR", path), lambda path: report.plot_bars(cells, "MAD", path),
             lambda path: report.plot_positions([a5], path), lambda path: report.plot_positions([mqar], path),
             lambda path: report.plot_curves([a5], path)]  # fmt: skip
    monkeypatch.setattr(Axes, "set", fails)  # every plot sets its axes' labels or limits
    open_before = plt.get_fignums()
    for plot in plots:
        with pytest.raises(ValueError, match="drawing failed"):
            plot(tmp_path / "p.png")
        assert plt.get_fignums() == open_before
    assert list(tmp_path.iterdir()) == []
