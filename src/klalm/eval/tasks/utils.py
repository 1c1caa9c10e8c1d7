"""Loaders and preprocessing for the local HellaSwag and PIQA tasks (referenced from the task YAMLs).

The loaders read the original files under `data_dir` and return a `datasets.DatasetDict` with one
"validation" split whose rows have the upstream hub datasets' fields:
- HellaSwag (`Rowan/hellaswag` on the hub): ind, activity_label, ctx_a, ctx_b, ctx, split, split_type, label,
  endings, source_id. The original file stores `label` as an int, the hub as a string; the task's target
  template renders either as the same digit, which lm-eval turns back into the choice index.
- PIQA (`baber/piqa` on the hub): goal, sol1, sol2, label (0 → sol1, 1 → sol2), the labels read from the
  separate `valid-labels.lst`, aligned line by line.

HellaSwag's preprocessing reproduces lm-eval's upstream `hellaswag/utils.py` exactly: the context is
ctx_a + " " + ctx_b.capitalize(), the query is activity_label + ": " + context, and query and endings are cleaned
(strip, " [title]" → ". ", bracketed "[...]" spans removed, double spaces → single). tests/eval checks the result
against the upstream function on all 10,042 rows.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import datasets

from klalm.eval.tasks import TASKS, resolve_files

_BRACKETED = re.compile(r"\[.*?\]")  # non-greedy: each "[...]" span on its own (WikiHow markup)


def _open_text(path: Path):
    """Open a text file, transparently decompressing `.gz`."""
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file (`.jsonl` or `.jsonl.gz`); blank lines are skipped.

    Raises:
        ValueError: a line is not valid JSON (file and line number named).
    """
    rows = []
    with _open_text(path) as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg})") from err
    return rows


def _require_data_dir(data_dir: str | None, task: str) -> str:
    if data_dir is None:
        raise ValueError(f"task {task!r} reads local files: pass metadata={{'data_dir': DIR}} to the TaskManager")
    return data_dir


def read_hellaswag(data_dir: str | Path) -> list[dict[str, Any]]:
    """The raw HellaSwag validation rows from `<data_dir>/hellaswag/hellaswag_val.jsonl[.gz]`."""
    (path,) = resolve_files(TASKS["hellaswag"], data_dir)
    return read_jsonl(path)


def read_piqa(data_dir: str | Path) -> list[dict[str, Any]]:
    """PIQA validation rows (goal, sol1, sol2, label) from `valid.jsonl` joined with `valid-labels.lst`.

    Raises:
        ValueError: the two files have different row counts, or a label is not 0 or 1.
    """
    rows_path, labels_path = resolve_files(TASKS["piqa"], data_dir)
    rows = read_jsonl(rows_path)
    labels = [line.strip() for line in labels_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(labels) != len(rows):
        raise ValueError(f"{rows_path} has {len(rows)} rows but {labels_path} has {len(labels)} labels")
    bad = next((i for i, label in enumerate(labels) if label not in ("0", "1")), None)
    if bad is not None:
        raise ValueError(f"{labels_path}:{bad + 1}: label {labels[bad]!r} is not 0 or 1")
    return [{"goal": r["goal"], "sol1": r["sol1"], "sol2": r["sol2"], "label": int(y)} for r, y in zip(rows, labels)]


def load_hellaswag(data_dir: str | None = None, **_task_metadata: Any) -> datasets.DatasetDict:
    """lm-eval `custom_dataset` hook: HellaSwag validation from `data_dir`, preprocessed (`hellaswag_doc`).

    Upstream runs the same per-row function as its `process_docs` hook; lm-eval calls that hook on every access
    to the docs (5 times per evaluation), which costs ~3 s each on 10,042 in-memory rows, so the local task
    applies it once here instead. lm-eval calls this with the task's whole metadata (version, config_source,
    ...) as keyword arguments; only `data_dir` is used.
    """
    rows = read_hellaswag(_require_data_dir(data_dir, "hellaswag_local"))
    docs = [{**row, **hellaswag_doc(row)} for row in rows]
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(docs)})


def load_piqa(data_dir: str | None = None, **_task_metadata: Any) -> datasets.DatasetDict:
    """lm-eval `custom_dataset` hook: PIQA validation from `data_dir` (see `load_hellaswag`)."""
    rows = read_piqa(_require_data_dir(data_dir, "piqa_local"))
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)})


def preprocess(text: str) -> str:
    """HellaSwag text clean-up, as upstream: strip, " [title]" → ". ", drop "[...]" spans, "  " → " " (one pass)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = _BRACKETED.sub("", text)
    return text.replace("  ", " ")


def hellaswag_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """The fields lm-eval's HellaSwag prompt reads: query, choices (cleaned endings) and gold (int label)."""
    context = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    return {
        "query": preprocess(doc["activity_label"] + ": " + context),
        "choices": [preprocess(ending) for ending in doc["endings"]],
        "gold": int(doc["label"]),
    }
