"""Write evaluation results: results.json (metrics and provenance), results.md (comparison table), samples.

results.json layout:
    {"results": {label: {task: {acc, acc_stderr, acc_norm, acc_norm_stderr, n_evaluated, n_total}}},
     "models": {label: {checkpoint, kind, arch, model_type, model_class, n_params, dtype, device, ...}},
     "tasks": {task: {lm_eval_name, source, config, data_files}},
     "settings": {limit, num_fewshot, batch_size, max_length, log_samples, data_dir, tokenizer},
     "versions": {klalm, lm_eval, torch, transformers}, "date": ISO 8601 UTC, "host": hostname}
`label` is the checkpoint folder or file name (made unique with its parent folders when names repeat). With
log_samples, each label × task has its `samples_<label>_<task>.jsonl` beside it (`samples_file`); writing a report
over an earlier one removes the earlier one's samples files that this one does not name, so the folder's samples are
the ones its results.json describes.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

from klalm.eval.harness import METRICS, TaskSpec
from klalm.fileio import atomic_path, write_atomic
from klalm.markdown import percent

_VERSIONED = ("klalm", "lm_eval", "torch", "transformers")


def checkpoint_labels(paths: list[str | Path]) -> list[str]:
    """Short unique labels for checkpoint paths: the last path part, extended leftwards until unique."""
    parts = [Path(p).expanduser().resolve().parts for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    raise ValueError(f"checkpoint paths repeat: {[str(p) for p in paths]}")


def versions() -> dict[str, str]:
    """Installed versions of the packages that decide the numbers."""
    return {name: version(name.replace("_", "-")) for name in _VERSIONED}


def build_report(
    results: dict[str, dict[str, Any]],
    models: dict[str, dict[str, Any]],
    specs: list[TaskSpec],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The results.json document (see the module docstring)."""
    return {
        "results": results,
        "models": models,
        "tasks": {spec.name: {k: v for k, v in asdict(spec).items() if k != "name"} for spec in specs},
        "settings": settings,
        "versions": versions(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
    }


def _cell(scores: dict[str, Any], metric: str) -> str:
    return percent(scores[metric], scores[f"{metric}_stderr"])  # stderr None for one example


def markdown_table(report: dict[str, Any]) -> str:
    """One row per checkpoint, acc and acc_norm (in %, ± stderr) per task, plus parameter count and arch."""
    tasks = list(report["tasks"])
    header = ["checkpoint", "arch", "params"] + [f"{task} {metric}" for task in tasks for metric in METRICS]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for label, per_task in report["results"].items():
        model = report["models"][label]
        cells = [label, str(model["arch"]), f"{model['n_params']:,}"]
        cells += [_cell(per_task[task], metric) for task in tasks for metric in METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    settings = report["settings"]
    counts = ", ".join(f"{t} {next(iter(report['results'].values()))[t]['n_evaluated']}" for t in tasks)
    lines.append("")
    lines.append(
        f"Zero-shot, lm-eval {report['versions']['lm_eval']}, examples per task: {counts} "
        f"(limit {settings['limit']}), {report['date']}, {report['host']}. Metrics in %, ± stderr."
    )
    return "\n".join(lines) + "\n"


def samples_file(label: str, task: str) -> str:
    """The name of one checkpoint's samples of one task: `samples_<label>_<task>.jsonl` (label's "/" → "__")."""
    return f"samples_{label.replace('/', '__')}_{task}.jsonl"


def _samples_files(report: Any) -> set[str]:
    """The samples files a results.json document names (none without log_samples, or for one of another shape)."""
    try:
        if not report["settings"]["log_samples"]:
            return set()
        return {samples_file(label, task) for label, tasks in report["results"].items() for task in tasks}
    except (KeyError, TypeError, AttributeError):
        return set()


def write_report(report: dict[str, Any], output_dir: str | Path) -> tuple[Path, Path]:
    """Write results.json and results.md into `output_dir` (created); returns both paths. The samples files of the
    results.json it replaces that this report does not name are removed: an earlier evaluation's, which the folder
    would otherwise mix with this one's."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "results.json", out / "results.md"
    try:
        earlier = _samples_files(json.loads(json_path.read_text(encoding="utf-8")))
    except (OSError, ValueError):  # none, or not JSON: no samples files known to be klalm's
        earlier = set()
    write_atomic(json_path, json.dumps(report, indent=2) + "\n")
    write_atomic(md_path, markdown_table(report))
    for name in sorted(earlier - _samples_files(report)):
        if (out / name).parent == out:  # (a hand-edited task name could point elsewhere)
            (out / name).unlink(missing_ok=True)
    return json_path, md_path


def write_samples(samples: dict[str, list[dict[str, Any]]], label: str, output_dir: str | Path) -> list[Path]:
    """Per-sample lm-eval records as `samples_file(label, task)`, each written whole or not at all
    (`klalm.fileio.atomic_path`); returns the paths."""
    from lm_eval.utils import handle_non_serializable

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for task, records in samples.items():
        path = out / samples_file(label, task)
        with atomic_path(path) as temporary, temporary.open("w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, default=handle_non_serializable, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths
