"""klalm.study.report: generated sections replace only their own blocks, and docs/RESULTS.md is what the committed
results produce (so none of its generated numbers is typed by hand or out of date)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from klalm.markdown import fill_sections
from klalm.study.report import plot_val_curves, write_report
from klalm.study.results import bench_rates
from klalm.study.spec import load_spec

REPO = Path(__file__).resolve().parents[2]


def test_fill_replaces_only_between_markers():
    text = "intro\n<!-- study:a -->\nold\n<!-- /study:a -->\nprose\n<!-- study:b -->\n<!-- /study:b -->\n"
    filled = fill_sections(text, {"a": "new a", "b": "new b\n"}, "study")
    assert (
        filled
        == "intro\n<!-- study:a -->\nnew a\n<!-- /study:a -->\nprose\n<!-- study:b -->\nnew b\n<!-- /study:b -->\n"
    )
    assert fill_sections(filled, {"a": "new a", "b": "new b"}, "study") == filled  # idempotent
    with pytest.raises(ValueError, match="study:c"):
        fill_sections(text, {"c": "x"}, "study")


def test_results_md_matches_the_committed_results(tmp_path, monkeypatch):
    doc = tmp_path / "RESULTS.md"
    shutil.copy(REPO / "docs/RESULTS.md", doc)
    spec = load_spec()
    spec = type(spec)(**{**spec.__dict__, "results": REPO / spec.results})
    monkeypatch.chdir(REPO)  # cost.bench_rows name files from the repository root, and the doc names them so
    write_report(spec, doc)
    assert doc.read_text() == (REPO / "docs/RESULTS.md").read_text(), "run `klalm-study report` and commit the doc"
    assert (tmp_path / "img/study_val_loss.png").stat().st_size > 10_000


def test_bench_rates_read_the_study_shape_first_file_first(tmp_path):
    def rows(*entries):
        shape = ("batch_size", "seq_len", "compile")
        return json.dumps([{"model": m, "setting": dict(zip(shape, s, strict=True)), "perf/tokens_per_s": v}
                           for m, *s, v in entries])  # fmt: skip

    (tmp_path / "a.json").write_text(rows(("kla_45m", 16, 2048, True, 9.0), ("kla_45m", 4, 8192, False, 8.0),
                                          ("gpt_45m", 16, 2048, False, 5.0)))  # fmt: skip
    (tmp_path / "b.json").write_text(rows(("gpt_45m", 16, 2048, False, 6.0), ("kla_45m", 16, 2048, False, 3.0)))
    (tmp_path / "c.json").write_text(json.dumps([{"model": "mamba_45m", "setting": {}, "error": "OOM"}]))
    rates = bench_rates([tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"])
    assert rates == {"gpt_45m": (5.0, str(tmp_path / "a.json")), "kla_45m": (3.0, str(tmp_path / "b.json"))}
    with pytest.raises(FileNotFoundError, match=r"cost.bench_rows: .*missing.json does not exist"):
        bench_rates([tmp_path / "missing.json"])


def test_a_null_stderr_is_shown_as_n_a():
    """klalm-eval stores a stderr lm-eval cannot compute (limit=1) as null: the tables formatted 100 * None."""
    from klalm.study.report import _difference, _pct

    def run(acc, stderr):
        return {"eval": {"results": {"hf": {"piqa": {"acc": acc, "acc_stderr": stderr}}}}}

    base, known, unknown = run(0.25, 0.01), run(0.5, 0.01), run(0.5, None)
    assert _pct(unknown, "piqa", "acc") == "50.00 ± n/a" and _pct(known, "piqa", "acc") == "50.00 ± 1.00"
    assert _difference(unknown, base, "piqa", "acc") == "+25.00 ± n/a"
    assert _difference(base, unknown, "piqa", "acc") == "-25.00 ± n/a"
    assert _difference(known, base, "piqa", "acc") == "+25.00 ± 1.41 (> 2σ)"


@pytest.mark.filterwarnings("ignore:No artists with labels")  # no runs: an empty legend
def test_the_plot_cut_off_mid_write_leaves_the_old_image_whole(tmp_path, savefig_cut_off):
    """img/study_val_loss.png was written in place: a kill mid-write left a truncated image that the doc links to. The
    figure is closed all the same (pyplot kept it)."""
    import matplotlib.pyplot as plt

    plot = tmp_path / "img" / "study_val_loss.png"
    plot.parent.mkdir()
    plot.write_bytes(b"old image")
    open_before = plt.get_fignums()
    with pytest.raises(OSError, match="cut off mid-write"):
        plot_val_curves(load_spec(), [], plot)
    assert plot.read_bytes() == b"old image" and [p.name for p in plot.parent.iterdir()] == [plot.name]
    assert plt.get_fignums() == open_before
