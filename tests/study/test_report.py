"""klalm.study.report: generated sections replace only their own blocks, and docs/RESULTS.md is what the committed
results produce (so none of its generated numbers is typed by hand or out of date)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from klalm.markdown import fill_sections
from klalm.study.report import write_report
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


def test_results_md_matches_the_committed_results(tmp_path):
    doc = tmp_path / "RESULTS.md"
    shutil.copy(REPO / "docs/RESULTS.md", doc)
    spec = load_spec()
    spec = type(spec)(**{**spec.__dict__, "results": REPO / spec.results})
    write_report(spec, doc)
    assert doc.read_text() == (REPO / "docs/RESULTS.md").read_text(), "run `klalm-study report` and commit the doc"
    assert (tmp_path / "img/study_val_loss.png").stat().st_size > 10_000
