"""klalm-eval end to end on a tiny klalm checkpoint: the reported accuracies equal an independent scoring; and
`klalm-lm-eval`'s one-line refusals of lm-eval arguments before any model loads."""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lm_eval.tasks.hellaswag.utils import preprocess as upstream_preprocess
from transformers import AutoModelForCausalLM

from klalm.cli import lm_eval as klalm_lm_eval
from klalm.config_checks import ConfigError
from klalm.eval import evaluate_checkpoints
from klalm.eval.harness import TaskSpec, check_run_args
from klalm.eval.report import build_report, write_report, write_samples

LIMIT = 10


def _hellaswag_examples(shared_data: Path, n: int) -> list[tuple[str, list[str], int]]:
    """(context, choices, gold) of the first n rows, built from the raw file with upstream's clean-up."""
    examples = []
    with gzip.open(shared_data / "hellaswag" / "hellaswag_val.jsonl.gz", "rt", encoding="utf-8") as handle:
        for _, line in zip(range(n), handle):
            row = json.loads(line)
            ctx = upstream_preprocess(row["activity_label"] + ": " + row["ctx_a"] + " " + row["ctx_b"].capitalize())
            examples.append((ctx, [upstream_preprocess(e) for e in row["endings"]], int(row["label"])))
    return examples


def _piqa_examples(shared_data: Path, n: int) -> list[tuple[str, list[str], int]]:
    lines = (shared_data / "piqa" / "valid.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    labels = (shared_data / "piqa" / "valid-labels.lst").read_text().split()[:n]
    rows = [json.loads(line) for line in lines]
    return [(f"Question: {r['goal']}\nAnswer:", [r["sol1"], r["sol2"]], int(y)) for r, y in zip(rows, labels)]


@torch.no_grad()
def _continuation_loglik(model, tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context) summed over its tokens; trailing context spaces move to the continuation."""
    stripped = context.rstrip()
    continuation = context[len(stripped) :] + continuation
    ctx_ids = tokenizer(stripped).input_ids
    all_ids = tokenizer(stripped + continuation).input_ids
    logprobs = torch.log_softmax(model(input_ids=torch.tensor([all_ids])).logits[0].double(), dim=-1)  # [T, V]
    return sum(logprobs[t - 1, all_ids[t]].item() for t in range(len(ctx_ids), len(all_ids)))


def _independent_scores(model, tokenizer, examples):
    """Per-example log-likelihoods of " " + choice, acc (argmax) and acc_norm (argmax of ll / len(choice))."""
    lls, acc, acc_norm = [], [], []
    for context, choices, gold in examples:
        ll = np.array([_continuation_loglik(model, tokenizer, context, " " + c) for c in choices])
        lls.append(ll)
        acc.append(float(np.argmax(ll) == gold))
        acc_norm.append(float(np.argmax(ll / np.array([len(c) for c in choices])) == gold))
    return lls, float(np.mean(acc)), float(np.mean(acc_norm))


def _logged_lls(path: Path) -> list[np.ndarray]:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [np.array([resp[0] for resp in r["filtered_resps"]]) for r in sorted(records, key=lambda r: r["doc_id"])]


def test_accuracies_equal_independent_scoring(tiny_checkpoints, gpt2_tokenizer, shared_data, tmp_path):
    trained = tiny_checkpoints[0]
    report = evaluate_checkpoints(
        [trained],
        ["hellaswag", "piqa"],
        output_dir=tmp_path,
        data_dir=shared_data,
        limit=LIMIT,
        batch_size=5,
        max_length=512,
        device="cpu",
        dtype="float64",
        log_samples=True,
    )
    assert json.loads((tmp_path / "results.json").read_text()) == report
    model = AutoModelForCausalLM.from_pretrained(trained).double().eval()
    examples = {"hellaswag": _hellaswag_examples(shared_data, LIMIT), "piqa": _piqa_examples(shared_data, LIMIT)}
    for task, task_examples in examples.items():
        lls, acc, acc_norm = _independent_scores(model, gpt2_tokenizer, task_examples)
        scores = report["results"]["export"][task]
        assert scores["n_evaluated"] == LIMIT
        assert scores["acc"] == pytest.approx(acc, abs=1e-12)
        assert scores["acc_norm"] == pytest.approx(acc_norm, abs=1e-12)
        for metric, value in (("acc", acc), ("acc_norm", acc_norm)):  # lm-eval: sample std / sqrt(n)
            assert scores[f"{metric}_stderr"] == pytest.approx(np.sqrt(value * (1 - value) / (LIMIT - 1)))
        logged = _logged_lls(tmp_path / f"samples_export_{task}.jsonl")
        assert len(logged) == LIMIT
        for i, (ours, theirs) in enumerate(zip(lls, logged)):
            np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-8, err_msg=f"{task} doc {i}")


def test_two_checkpoints_one_table_with_provenance(tiny_checkpoints, shared_data, tmp_path):
    """With the tokenizer= override that ran recorded (results.json did not say one had been given)."""
    tokenizer = shared_data / "gpt2_tokenizer"
    report = evaluate_checkpoints(
        list(tiny_checkpoints), ["piqa"], output_dir=tmp_path, data_dir=shared_data, limit=4, device="cpu",
        tokenizer=tokenizer,
    )  # fmt: skip
    assert list(report["results"]) == ["trained/export", "untrained/export"]
    for label, path in zip(report["results"], tiny_checkpoints):
        model = report["models"][label]
        assert model["arch"] == "gpt" and model["kind"] == "hf_export" and model["checkpoint"] == str(path)
        reference = AutoModelForCausalLM.from_pretrained(path)
        assert model["n_params"] == sum(p.numel() for p in reference.parameters())
    assert report["tasks"]["piqa"]["lm_eval_name"] == "piqa_local"
    data_files = [Path(f["path"]).name for f in report["tasks"]["piqa"]["data_files"]]
    assert data_files == ["valid.jsonl", "valid-labels.lst"]
    assert report["settings"]["limit"] == 4 and report["versions"]["lm_eval"].startswith("0.4")
    assert report["settings"]["tokenizer"] == str(tokenizer.resolve())
    table = (tmp_path / "results.md").read_text()
    assert "| trained/export | gpt |" in table and "| untrained/export | gpt |" in table
    assert "piqa acc_norm" in table


def test_one_example_has_no_stderr_and_still_writes_the_table(tiny_checkpoints, shared_data, tmp_path):
    """limit=1: lm-eval's stderr is the string "N/A"; it went into results.json as such and results.md's table
    ended in a traceback (a str formatted with :.2f)."""
    report = evaluate_checkpoints(
        [tiny_checkpoints[0]], ["piqa"], output_dir=tmp_path, data_dir=shared_data, limit=1, device="cpu"
    )
    scores = json.loads((tmp_path / "results.json").read_text())["results"]["export"]["piqa"]
    assert scores["acc_stderr"] is None and scores["acc_norm_stderr"] is None and scores["n_evaluated"] == 1
    assert report["results"]["export"]["piqa"] == scores
    table = (tmp_path / "results.md").read_text()
    assert re.search(r"\| export \| gpt \| [\d,]+ \| \d+\.00 ± n/a \| \d+\.00 ± n/a \|", table)


def test_a_report_over_an_earlier_one_removes_the_samples_only_that_one_named(tmp_path):
    """An evaluation into a folder holding an earlier one's results replaced results.json and left the earlier
    samples files beside it, so the folder mixed two runs' samples. The report's own and files no report of klalm's
    names stay."""
    spec = TaskSpec("piqa", "piqa_local", "local", "piqa_local.yaml")
    scores = {"acc": 0.5, "acc_stderr": 0.1, "acc_norm": 0.5, "acc_norm_stderr": 0.1, "n_evaluated": 2, "n_total": 9}
    model = {"arch": "gpt", "n_params": 1}

    def report(labels, log_samples):
        settings = {"limit": 2, "log_samples": log_samples}
        return build_report({label: {"piqa": scores} for label in labels}, dict.fromkeys(labels, model), [spec],
                            settings)  # fmt: skip

    write_report(report(["a/export", "b/export"], True), tmp_path)
    for name in ("samples_a__export_piqa.jsonl", "samples_b__export_piqa.jsonl", "samples_mine.jsonl", "notes.txt"):
        (tmp_path / name).write_text("{}\n")
    write_report(report(["a/export"], True), tmp_path)
    assert not (tmp_path / "samples_b__export_piqa.jsonl").exists()
    write_report(report(["a/export"], False), tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["notes.txt", "results.json", "results.md", "samples_mine.jsonl"]


def test_an_evaluation_prints_no_git_error_and_no_known_warning(shared_data, tmp_path, monkeypatch, capfd, caplog):
    """lm-eval ran `git describe` for a record klalm does not keep (outside a repository git printed "fatal: not a
    git repository"), the tokenizer of a model trained on 16 tokens warned that a 58-token request "will result
    in indexing errors", though lm-eval cuts every request to max_length, and lm-eval warned on every run of what klalm
    does on purpose (an in-memory model, local tasks, num_fewshot=0). Any other lm-eval warning still prints, during
    the run and after it, and the caller's tokenizer is left as it was."""
    from transformers import AutoTokenizer

    from klalm.eval import evaluate_model, resolve_tasks
    from klalm.models import build_model

    if shutil.which("git") is None:
        pytest.skip("no git here to print its error")
    monkeypatch.chdir(tmp_path)  # not inside a git repository
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)  # (its own handler: into caplog too)
    tokenizer = AutoTokenizer.from_pretrained(shared_data / "gpt2_tokenizer", model_max_length=16)  # (warns once)
    model = build_model("gpt", preset="tiny", vocab_size=len(tokenizer)).eval()
    loggers = [logging.getLogger(f"lm_eval.{name}") for name in ("models.huggingface", "api.task", "evaluator")]

    def warn(*_) -> None:
        for logger in loggers:
            logger.warning("something else")

    model.register_forward_pre_hook(warn)
    specs, manager = resolve_tasks(["piqa"], shared_data)
    capfd.readouterr()
    caplog.clear()
    evaluate_model(model, tokenizer, specs, manager, limit=2, batch_size=4, max_length=512)
    printed = "".join(capfd.readouterr())
    assert "not a git repository" not in printed and "Token indices" not in caplog.text + printed, printed
    known = ("not of type `str`", "already-initialized model", "Custom kwargs", "Overwriting default num_fewshot")
    assert not [text for text in known if text in caplog.text], caplog.text
    assert {r.name for r in caplog.records if r.getMessage() == "something else"} == {lg.name for lg in loggers}
    loggers[2].warning("Overwriting default num_fewshot of piqa_local from None to 0")  # (outside a run: not known)
    assert caplog.records[-1].getMessage().startswith("Overwriting")
    assert tokenizer.model_max_length == 16 and tokenizer.padding_side == "right"


def test_only_the_custom_kwargs_warning_of_klalms_own_tasks_is_kept_off(caplog):
    """lm-eval's "Custom kwargs can be passed to `--metadata`" was kept off for any task, though klalm causes it only
    with its local tasks: an upstream task that loads its rows through a function (ruler's niah_single_1, which takes
    its lengths from --metadata) lost the advice too."""
    from klalm.eval.harness import _quiet_lm_eval

    logger = logging.getLogger("lm_eval.api.task")
    advice = (
        ": Custom kwargs can be passed to `--metadata` in console (as json string) or to the TaskManager."
        """\nFor example --metadata='{"max_seq_lengths":[4096, 8192]}'. For details see task Readme."""
    )  # lm_eval.api.task.ConfigurableTask.download's, after the task's name
    with caplog.at_level(logging.WARNING, logger=logger.name), _quiet_lm_eval():
        for task in ("hellaswag_local", "piqa_local", "niah_single_1", "my_piqa_local"):
            logger.warning(task + advice)
    assert [record.getMessage() for record in caplog.records] == ["niah_single_1" + advice, "my_piqa_local" + advice]


def test_samples_are_written_whole_or_not_at_all(tmp_path):
    """A samples file stopped half-way (Ctrl-C, a full disk) left its first lines in place of the earlier file."""
    path = write_samples({"piqa": [{"doc_id": 0}]}, "a/export", tmp_path)[0]
    assert path.name == "samples_a__export_piqa.jsonl"

    def stopped():
        yield {"doc_id": 1}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_samples({"piqa": stopped()}, "a/export", tmp_path)
    assert path.read_text() == '{"doc_id": 0}\n' and [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("arch", ["gpt", "kla", "mamba", "gdn", "gpt_kla"])
def test_every_arch_scores_like_unbatched_forward(arch, gpt2_tokenizer, shared_data):
    """lm-eval batches right-padded requests; for every mixer the scores equal one unpadded forward per choice."""
    from klalm.eval import evaluate_model, resolve_tasks
    from klalm.models import build_model

    torch.manual_seed(0)
    model = build_model(arch, preset="tiny", vocab_size=len(gpt2_tokenizer)).double().eval()
    specs, manager = resolve_tasks(["piqa"], shared_data)
    metrics, samples = evaluate_model(
        model, gpt2_tokenizer, specs, manager, limit=4, batch_size=4, max_length=512, log_samples=True
    )
    lls, acc, acc_norm = _independent_scores(model, gpt2_tokenizer, _piqa_examples(shared_data, 4))
    logged = [np.array([r[0] for r in s["filtered_resps"]]) for s in sorted(samples["piqa"], key=lambda s: s["doc_id"])]
    for i, (ours, theirs) in enumerate(zip(lls, logged)):
        np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-8, err_msg=f"{arch} doc {i}")
    assert metrics["piqa"]["acc"] == pytest.approx(acc) and metrics["piqa"]["acc_norm"] == pytest.approx(acc_norm)


def test_an_answer_longer_than_max_length_is_a_config_error(gpt2_tokenizer, shared_data):
    """lm-eval asserts, without a message, that each whole answer fits the window: klalm names max_length."""
    from klalm.eval import evaluate_model, resolve_tasks
    from klalm.models import build_model

    model = build_model("gpt", preset="tiny", vocab_size=len(gpt2_tokenizer)).eval()
    specs, manager = resolve_tasks(["piqa"], shared_data)
    with pytest.raises(ConfigError, match="max_length=2: an answer of piqa is longer than that many tokens"):
        evaluate_model(model, gpt2_tokenizer, specs, manager, limit=4, batch_size=4, max_length=2)


def _lm_eval_args(**given) -> argparse.Namespace:
    """An `lm-eval run` namespace with a hub model (not loaded) and an upstream task: nothing local to check."""
    return argparse.Namespace(**{"model": "hf", "model_args": {"pretrained": "gpt2"}, "tasks": ["arc_easy"], **given})


def test_lm_eval_refuses_model_limit_and_batch_size_before_loading():
    """A typo'd --model, --limit -1 and --batch_size abc were tracebacks from inside lm-eval (the last two only after
    the model had loaded)."""
    cases = {
        "model": ("hff", r"--model hff: lm-eval has no such model \(closest: \['hf'\]\); valid: .*huggingface"),
        "limit": (-1.0, r"--limit -1 is invalid: must be > 0"),
        "batch_size": ("abc", r"--batch_size abc is invalid: must be a positive integer, 'auto' or 'auto:N'"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(ConfigError, match=message):
            check_run_args(_lm_eval_args(**{key: value}))
    for limit in (0.0, float("inf")):
        with pytest.raises(ConfigError, match=r"--limit"):
            check_run_args(_lm_eval_args(limit=limit))
    for batch_size in ("0", "auto:0", "-4", "4.5", "autox"):
        with pytest.raises(ConfigError, match=r"--batch_size"):
            check_run_args(_lm_eval_args(batch_size=batch_size))
    for batch_size in ("8", "auto", "auto:4"):
        check_run_args(_lm_eval_args(model="hf-auto", limit=0.5, batch_size=batch_size))


def test_lm_eval_refuses_an_output_path_it_cannot_write(tmp_path):
    """lm-eval saves its results after the run and, when it cannot, logs a warning and exits 0: an existing file as
    --output_path (a folder to lm-eval unless it ends in .json) or one under /proc lost the results."""
    (tmp_path / "precious.txt").write_text("keep")
    cases = {
        tmp_path / "precious.txt": r"precious\.txt is a file, not a folder \(lm-eval writes into a folder",
        tmp_path / "precious.txt" / "results.json": r"results\.json: .*precious\.txt is a file, not a folder$",
        Path("/proc/lmout"): r"--output_path /proc/lmout: cannot write in /proc \(",
    }
    for value, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            check_run_args(_lm_eval_args(output_path=str(value)))
    for value in (tmp_path / "new" / "deeper", tmp_path / "results.json", tmp_path / "new" / "results.json"):
        check_run_args(_lm_eval_args(output_path=str(value)))
    assert [p.name for p in tmp_path.iterdir()] == ["precious.txt"]  # the check leaves nothing behind
    assert (tmp_path / "precious.txt").read_text() == "keep"


def _cli_refusal(monkeypatch, *args: str) -> str:
    monkeypatch.setattr(
        sys, "argv", ["klalm-lm-eval", "run", "--model", "hf", "--model_args", "pretrained=gpt2", *args]
    )
    with pytest.raises(SystemExit) as info:
        klalm_lm_eval()
    return info.value.code


def test_klalm_lm_eval_turns_lm_eval_refusals_into_one_line(monkeypatch):
    """Non-JSON --metadata (raised inside lm-eval's argparse action) and an unknown task (raised by lm-eval's config
    check, before the model loads) were tracebacks."""
    message = _cli_refusal(monkeypatch, "--tasks", "arc_easy", "--metadata", "{data_dir: /x}")
    assert (
        message == "klalm-lm-eval: --metadata: Invalid JSON: {data_dir: /x}. Hint: Use double quotes for JSON strings."
    )

    class NoTasks:  # lm-eval's index of its ~15,000 tasks takes seconds to build; its refusal is what is tested
        def __init__(self, **_):
            pass

        def match_tasks(self, names):
            return []

    monkeypatch.setattr("lm_eval.tasks.TaskManager", NoTasks)
    assert _cli_refusal(monkeypatch, "--tasks", "hellaswag_locl") == "klalm-lm-eval: Tasks not found: hellaswag_locl"


def test_klalm_lm_eval_help_answers_before_torch_is_imported(console_in_fresh_python):
    """lm-eval's own parser answers `--help` and usage errors before klalm.eval imports torch and transformers (it
    took 6 s), naming the command klalm-lm-eval: its usage line, examples and errors said `lm-eval`."""
    cases = (
        (["--help"], 0, "stdout", "usage: klalm-lm-eval [-h] COMMAND ..."),
        (["run", "--help"], 0, "stdout", "usage: klalm-lm-eval run --model <model>"),
        (["validate", "--help"], 0, "stdout", "usage: klalm-lm-eval validate --tasks"),
        (["run", "--nope"], 2, "stderr", "klalm-lm-eval: error: unrecognized arguments: --nope"),
        (["run", "--limit", "x"], 2, "stderr", "klalm-lm-eval run: error: argument --limit/-L: invalid float value"),
    )
    for argv, status, stream, expected in cases:
        proc = console_in_fresh_python("lm_eval", "klalm-lm-eval", argv, ("torch", "transformers"))
        text = getattr(proc, stream)
        assert text.startswith("usage: klalm-lm-eval") and expected in text, proc.stderr[-2000:]
        assert re.search(r"(?<![\w-])lm-eval(?![\w-])", text) is None, text  # (lm-evaluation-harness in links)
        assert proc.stdout.splitlines()[-2:] == [f"exit {status}", "heavy []"]
