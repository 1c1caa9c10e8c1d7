"""Generated sections of hand-written Markdown documents.

A document keeps its prose; what lies between ``<!-- TAG:NAME -->`` and ``<!-- /TAG:NAME -->`` is replaced by the
generated section NAME (klalm.study.report writes docs/RESULTS.md with TAG "study", klalm.tasks.report writes
docs/synthetic.md with TAG "synthetic").
"""

from __future__ import annotations

import re


def fill_sections(text: str, sections: dict[str, str], tag: str) -> str:
    """Replaces each ``<!-- TAG:NAME -->…<!-- /TAG:NAME -->`` block's content; fails on a missing marker."""
    for name, body in sections.items():
        pattern = re.compile(rf"(<!-- {tag}:{name} -->\n).*?(<!-- /{tag}:{name} -->)", re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"the document lacks the markers <!-- {tag}:{name} --> … <!-- /{tag}:{name} -->")
        text = pattern.sub(lambda m, body=body: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)
    return text


def percent(value: float, stderr: float | None, signed: bool = False) -> str:
    """``value ± stderr`` in points of % (two decimals); the stderr is "n/a" where lm-eval could not compute it (None,
    e.g. for one example)."""
    return f"{100 * value:{'+' if signed else ''}.2f} ± " + ("n/a" if stderr is None else f"{100 * stderr:.2f}")
