"""Local HellaSwag/PIQA task definitions: same preprocessing, prompts and metrics as lm-eval's upstream tasks."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import datasets
import pytest
from lm_eval.tasks._yaml_loader import load_yaml

from klalm.config_checks import ConfigError
from klalm.eval.harness import resolve_tasks
from klalm.eval.tasks import TASKS, TASKS_DIR, get_local_task, utils

UPSTREAM_TASKS = Path(__import__("lm_eval.tasks", fromlist=["x"]).__file__).parent
# Keys allowed to differ from the upstream YAML: where the data comes from and the task's name.
LOADER_KEYS = {"task", "dataset_path", "dataset_name", "custom_dataset", "process_docs", "training_split", "tag"}


def _raw_hellaswag(shared_data: Path) -> list[dict]:
    with gzip.open(shared_data / "hellaswag" / "hellaswag_val.jsonl.gz", "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_hellaswag_preprocessing_equals_upstream_on_every_row(shared_data):
    from lm_eval.tasks.hellaswag.utils import process_docs

    raw = _raw_hellaswag(shared_data)
    assert len(raw) == 10_042
    upstream = process_docs(datasets.Dataset.from_list(raw)).to_list()
    local = utils.load_hellaswag(data_dir=str(shared_data), version=1.0)["validation"].to_list()
    assert len(local) == len(upstream)
    for i, (ours, theirs) in enumerate(zip(local, upstream)):
        for key in ("query", "choices", "gold", "label"):
            assert ours[key] == theirs[key], f"row {i} field {key}: {ours[key]!r} != {theirs[key]!r}"


def test_hellaswag_cleanup_cases():
    assert utils.preprocess(" Home and Garden: [header] How to fix a door [title] Sand it.  ") == (
        "Home and Garden: How to fix a door. Sand it."
    )
    assert utils.preprocess("a [step] b [substeps] c") == "a b c"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_local_yaml_equals_upstream_except_loader(name):
    local = load_yaml(TASKS_DIR / TASKS[name].yaml, resolve_func=False)
    upstream = load_yaml(UPSTREAM_TASKS / name / f"{name}.yaml", resolve_func=False)
    differing = {k for k in set(local) | set(upstream) if local.get(k) != upstream.get(k)}
    assert differing <= LOADER_KEYS, f"{name}: fields differ from upstream: {sorted(differing - LOADER_KEYS)}"
    assert local["task"] == TASKS[name].name != name


def test_piqa_rows_join_labels(shared_data):
    rows = utils.read_piqa(shared_data)
    labels = (shared_data / "piqa" / "valid-labels.lst").read_text().split()
    assert len(rows) == len(labels) == 1838
    assert [r["label"] for r in rows] == [int(y) for y in labels]
    assert rows[0]["goal"].startswith("How do I ready a guinea pig cage")


def test_task_objects_render_upstream_prompts(shared_data):
    """Through lm-eval's own task machinery: prompt text, choices and target per doc."""
    specs, manager = resolve_tasks(["hellaswag", "piqa"], shared_data)
    loaded = manager.load([s.lm_eval_name for s in specs])["tasks"]
    hellaswag, piqa = loaded["hellaswag_local"], loaded["piqa_local"]
    raw = _raw_hellaswag(shared_data)[:3]
    from lm_eval.tasks.hellaswag.utils import preprocess

    docs = hellaswag.validation_docs()
    for doc, row in zip((docs[i] for i in range(3)), raw):
        ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
        assert hellaswag.doc_to_text(doc) == preprocess(row["activity_label"] + ": " + ctx)
        assert hellaswag.doc_to_choice(doc) == [preprocess(e) for e in row["endings"]]
        assert hellaswag.doc_to_target(doc) == row["label"]
    doc = piqa.validation_docs()[1]
    assert piqa.doc_to_text(doc) == "Question: dresser\nAnswer:"
    assert piqa.doc_to_choice(doc) == ["replace drawer with bobby pin ", "finish, woodgrain with  bobby pin "]
    assert piqa.doc_to_target(doc) == 1


def test_plain_jsonl_accepted(tmp_path, shared_data):
    (tmp_path / "hellaswag").mkdir()
    rows = _raw_hellaswag(shared_data)[:5]
    (tmp_path / "hellaswag" / "hellaswag_val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["ind"] for r in utils.read_hellaswag(tmp_path)] == [r["ind"] for r in rows]


def test_missing_file_is_named(tmp_path):
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "valid.jsonl").write_text('{"goal": "g", "sol1": "a", "sol2": "b"}\n')
    with pytest.raises(FileNotFoundError, match="valid-labels.lst"):
        resolve_tasks(["piqa"], tmp_path)
    with pytest.raises(FileNotFoundError, match="hellaswag_val.jsonl"):
        resolve_tasks(["hellaswag"], tmp_path)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        resolve_tasks(["piqa"], tmp_path / "nowhere")


def test_piqa_label_count_mismatch(tmp_path):
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "valid.jsonl").write_text('{"goal": "g", "sol1": "a", "sol2": "b"}\n' * 2)
    (tmp_path / "piqa" / "valid-labels.lst").write_text("0\n")
    with pytest.raises(ValueError, match="2 rows but .* 1 labels"):
        utils.read_piqa(tmp_path)


def test_unknown_task_lists_valid_ones(shared_data):
    with pytest.raises(KeyError, match="hellaswag.*piqa"):
        resolve_tasks(["hellaswagg"], shared_data)
    with pytest.raises(KeyError, match="valid"):
        get_local_task("arc_easy")
    with pytest.raises(ValueError, match="empty"):
        resolve_tasks([], shared_data)
    with pytest.raises(ValueError, match="twice"):
        resolve_tasks(["piqa", "piqa_local"], shared_data)


@pytest.mark.slow  # indexes lm-eval's ~14,700 task YAMLs: ~7 s alone, far more on a busy 2-core machine
def test_upstream_names_without_data_dir():
    """No data_dir: names resolve against lm-eval's own index (no download happens before evaluation)."""
    with pytest.raises(ConfigError, match=r"no task 'hellaswagg' \(closest: \['hellaswag'"):
        resolve_tasks(["hellaswag", "piqa", "hellaswagg"])  # the first two pass, the typo fails
