"""lm-eval glue: resolve task names, wrap a model in `HFLM`, run `simple_evaluate` zero-shot, pick the metrics.

With a `data_dir`, the user-facing names ("hellaswag", "piqa") map to the local tasks in `klalm.eval.tasks`,
which read the original files and reproduce the upstream preprocessing and metrics; lm-eval's own task index is
then not loaded at all (offline, and ~7 s faster). Without a `data_dir`, names are lm-eval's upstream tasks,
used unchanged (they download from the hub).

`cli_main` is the `klalm-lm-eval` console script once `klalm.cli.lm_eval` has parsed its arguments with lm-eval's own
CLI (`--help` and usage errors before this module, torch and transformers load): lm-eval's CLI with klalm imported
first, so `--model hf --model_args pretrained=<klalm export>` loads klalm models. Before lm-eval runs, it checks what
klalm knows about (`check_run_args`): a local `pretrained=` path must be an export folder whose SHA256SUMS holds, and
klalm's local tasks need `--include_path` and a `data_dir` holding their files; `--model`, `--limit`, `--batch_size`
and `--output_path` are checked too (lm-eval fails on them with a traceback, some only after loading the model, or
for an unwritable output path only logs a warning after the run). Each refusal is one line, as are lm-eval's own
refusals of its arguments (a bad JSON option while parsing, an unknown task name).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import difflib
import hashlib
import json
import logging
import math
import re
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from klalm.config_checks import ConfigError
from klalm.errors import one_line
from klalm.eval.tasks import TASKS, TASKS_DIR, get_local_task, resolve_files
from klalm.ops.common import compute_dtype

log = logging.getLogger(__name__)

METRICS = ("acc", "acc_norm")  # reported per task, each with its stderr
METRIC_FILTER = "none"  # lm-eval's key suffix for multiple-choice metrics: "acc,none"


@dataclass
class TaskSpec:
    """One task to run, as the user named it, and what backs it.

    Attributes:
        name: user-facing name ("hellaswag").
        lm_eval_name: task name inside lm-eval ("hellaswag_local" or the upstream "hellaswag").
        source: "local" (files in data_dir) or "upstream" (lm-eval's hub task).
        config: path of the task YAML.
        data_files: for local tasks, each file read with its size in bytes and sha256.
    """

    name: str
    lm_eval_name: str
    source: str
    config: str
    data_files: list[dict[str, Any]] = field(default_factory=list)


def _file_facts(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"path": str(path.resolve()), "bytes": path.stat().st_size, "sha256": digest}


def _local_spec(name: str, data_dir: str | Path) -> TaskSpec:
    try:
        task = get_local_task(name)
    except KeyError as err:
        raise KeyError(f"task {name!r} has no local definition for data_dir; valid: {sorted(TASKS)}") from err
    files = resolve_files(task, data_dir)
    user_name = next(key for key, value in TASKS.items() if value is task)
    check_local_rows(user_name, data_dir, files)
    return TaskSpec(user_name, task.name, "local", str(TASKS_DIR / task.yaml), [_file_facts(p) for p in files])


def check_local_rows(name: str, data_dir: str | Path, files: list[Path]) -> None:
    """Reads the rows of the local task `name` ("piqa") as its lm-eval loader will, so that a malformed file (a line
    that is not JSON, PIQA's labels not matching its rows, a truncated .gz) is refused before any model loads rather
    than as a traceback from inside lm-eval after it.

    Raises:
        ConfigError: naming the task and the file.
    """
    from klalm.eval.tasks.utils import read_hellaswag, read_piqa

    read = {"hellaswag": read_hellaswag, "piqa": read_piqa}[name]
    try:
        read(data_dir)
    except (ValueError, EOFError, OSError, KeyError, TypeError) as err:  # (UnicodeDecodeError is a ValueError, a bad
        # .gz an OSError; a row without a field a KeyError, a line that is not a JSON object a TypeError)
        reason = one_line(err)
        if isinstance(err, KeyError):
            reason = f"a row has no field {err}"
        elif isinstance(err, TypeError):
            reason = f"a row is not a JSON object ({reason})"
        if not any(str(path) in reason for path in files):
            reason = f"{' / '.join(map(str, files))}: {reason}"
        raise ConfigError(f"data_dir: task {name!r} cannot read its data: {reason}") from None


def _upstream_spec(name: str, manager: Any) -> TaskSpec:
    if name not in manager.all_tasks:
        close = difflib.get_close_matches(name, manager.all_tasks, n=5)
        raise ConfigError(
            f"tasks: lm-eval has no task {name!r} (closest: {close}; `lm-eval ls tasks` lists all "
            f"{len(manager.all_tasks)}); with data_dir the local tasks are {sorted(TASKS)}"
        )
    entry = manager.task_index.get(name)
    config = str(entry.yaml_path) if entry is not None and entry.yaml_path else "unknown"
    return TaskSpec(name, name, "upstream", config)


def resolve_tasks(names: list[str], data_dir: str | Path | None = None) -> tuple[list[TaskSpec], Any]:
    """Check task names (and data files) and build the lm-eval `TaskManager` that serves them.

    Args:
        names: user-facing task names, e.g. ["hellaswag", "piqa"].
        data_dir: folder laid out like ../shared/data; None → lm-eval's upstream (hub) tasks.

    Returns:
        (specs, task_manager), specs in the order of `names`.

    Raises:
        ConfigError (a ValueError): no task names, a name given twice, an upstream task lm-eval does not have
            (the closest names listed), or a local task's file that cannot be read (`check_local_rows`).
        KeyError: a name with no local task, with `data_dir` (the message lists the valid ones).
        FileNotFoundError: `data_dir` lacks a file a task needs (named).
    """
    from lm_eval.tasks import TaskManager

    names = list(names)
    if not names:
        raise ConfigError("tasks is empty: name at least one, e.g. tasks=[hellaswag,piqa]")
    if len(set(names)) != len(names):
        raise ConfigError(f"tasks lists a name twice: {names}")
    if data_dir is not None:
        specs = [_local_spec(name, data_dir) for name in names]
        if len({spec.name for spec in specs}) != len(specs):
            raise ConfigError(f"tasks names one task twice (a local name is an alias of its upstream one): {names}")
        meta = {"data_dir": str(Path(data_dir).expanduser().resolve())}
        return specs, TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=meta)
    manager = TaskManager()
    return [_upstream_spec(name, manager) for name in names], manager


def make_lm(model: Any, tokenizer: Any, *, max_length: int, batch_size: int) -> Any:
    """Wrap an in-memory causal LM in lm-eval's `HFLM` (causal backend, explicit max length and batch size).

    The log-softmax over the vocabulary runs in float32 for float32/bfloat16/float16 weights (float64 for
    float64 weights): in half precision it would round the choices' log-likelihoods to ~3 significant digits.

    HFLM gets a copy of the tokenizer whose `model_max_length` is `max_length`, the window it cuts every request to:
    an export's is the context it was trained on (64 tokens for a smoke run), and transformers warned at the first
    request beyond it ("Token indices sequence length is longer than ... (92 > 64)") that the model would fail on a
    sequence it never sees uncut. (The copy also keeps HFLM's padding side off the caller's tokenizer.)
    """
    from lm_eval.models.huggingface import HFLM

    if max_length < 1 or batch_size < 1:
        raise ValueError(f"max_length ({max_length}) and batch_size ({batch_size}) must be positive")
    weight_dtype = next(model.parameters()).dtype
    softmax_dtype = compute_dtype(weight_dtype)
    tokenizer = copy.copy(tokenizer)
    tokenizer.model_max_length = max_length
    return HFLM(
        pretrained=model,
        tokenizer=tokenizer,
        backend="causal",
        max_length=max_length,
        batch_size=batch_size,
        softmax_dtype=softmax_dtype,
    )


def task_metrics(raw: dict[str, Any], spec: TaskSpec) -> dict[str, Any]:
    """acc, acc_norm, their stderr and the example counts of one task from `simple_evaluate`'s output. A stderr
    lm-eval cannot compute (one example: its "N/A") is None."""
    scores = raw["results"][spec.lm_eval_name]
    out: dict[str, Any] = {}
    for metric in METRICS:
        out[metric] = scores[f"{metric},{METRIC_FILTER}"]
        stderr = scores[f"{metric}_stderr,{METRIC_FILTER}"]
        out[f"{metric}_stderr"] = stderr if isinstance(stderr, (int, float)) else None
    counts = raw["n-samples"][spec.lm_eval_name]
    out.update(n_evaluated=counts["effective"], n_total=counts["original"])
    return out


# lm-eval's warnings that hold for every klalm evaluation, by logger, each matched from the start of its message: klalm
# hands HFLM a model already loaded (twice told that other arguments may be ignored), its local tasks load their rows
# through a function (told, each under its name, to pass kwargs through --metadata: another task that loads so, e.g.
# ruler's, which reads its lengths from there, is still told), and it asks for num_fewshot=0 where a task has none.
_LM_EVAL_NOISE = {
    "lm_eval.models.huggingface": re.compile(
        r"`pretrained` model kwarg is not of type `str`|Passed an already-initialized model through `pretrained`"
    ),
    "lm_eval.api.task": re.compile(
        f"(?:{'|'.join(re.escape(task.name) for task in TASKS.values())}): Custom kwargs can be passed to `--metadata`"
    ),
    "lm_eval.evaluator": re.compile(r"Overwriting default num_fewshot of \S+ from None to 0$"),
}


@contextlib.contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    """Keeps what lm-eval prints on every klalm evaluation, and that says nothing about it, off the console while
    inside: the `_LM_EVAL_NOISE` warnings (any other lm-eval warning still prints), and git's "fatal: not a git
    repository" outside a repository (lm-eval runs `git describe` for a record of the working folder's commit that
    klalm does not keep)."""
    from lm_eval import evaluator

    def wanted(record: logging.LogRecord) -> bool:
        return not _LM_EVAL_NOISE[record.name].match(record.getMessage())

    loggers = [logging.getLogger(name) for name in _LM_EVAL_NOISE]
    for logger in loggers:
        logger.addFilter(wanted)
    try:
        with mock.patch.object(evaluator, "get_git_commit_hash", lambda: None):
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(wanted)


def evaluate_model(
    model: Any,
    tokenizer: Any,
    specs: list[TaskSpec],
    task_manager: Any,
    *,
    limit: int | None = None,
    batch_size: int = 16,
    max_length: int = 2048,
    log_samples: bool = False,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Zero-shot lm-eval of one in-memory model.

    Args:
        model: causal LM (`transformers.PreTrainedModel`), on its device, in eval mode.
        tokenizer: its tokenizer.
        specs, task_manager: from `resolve_tasks`.
        limit: at most this many examples per task (the first ones, in file order); None = all.
        batch_size: requests per forward pass.
        max_length: context window in tokens; longer requests are left-truncated.
        log_samples: also return lm-eval's per-sample records.

    Returns:
        (metrics, samples): metrics[task] = {acc, acc_stderr, acc_norm, acc_norm_stderr, n_evaluated, n_total};
        samples[task] = per-sample records (empty unless `log_samples`), keyed by user-facing task name.

    Raises:
        ConfigError: an answer longer than `max_length` tokens (lm-eval's bare AssertionError).
    """
    from lm_eval import simple_evaluate

    with _quiet_lm_eval():
        lm = make_lm(model, tokenizer, max_length=max_length, batch_size=batch_size)
        try:
            raw = simple_evaluate(
                model=lm,
                tasks=[spec.lm_eval_name for spec in specs],
                num_fewshot=0,
                limit=limit,
                log_samples=log_samples,
                task_manager=task_manager,
            )
        except AssertionError as err:  # lm-eval asserts that each whole answer fits the window, with no message
            if not _raised_in(err, "lm_eval.models.huggingface"):
                raise
            names = ", ".join(spec.name for spec in specs)
            raise ConfigError(f"max_length={max_length}: an answer of {names} is longer than that many tokens, and "
                              "lm-eval scores each whole answer in the window: raise max_length") from None  # fmt: skip
    metrics = {spec.name: task_metrics(raw, spec) for spec in specs}
    samples = {spec.name: raw.get("samples", {}).get(spec.lm_eval_name, []) for spec in specs}
    return metrics, samples


LOCAL_TASK_NAMES = {task.name: task for task in TASKS.values()}  # "piqa_local" -> its LocalTask


def _local_path(value: Any) -> Path | None:
    """`pretrained=` as a local path: one that exists or is written as a path (a hub id has at most one "/": "gpt2",
    "EleutherAI/pythia-70m"); None for a hub id."""
    if not isinstance(value, str):
        return None
    path = Path(value).expanduser()
    if path.exists() or value.startswith(("/", "./", "../", "~")) or value in (".", "..") or value.count("/") > 1:
        return path
    return None


def _check_pretrained(value: Any) -> None:
    from klalm.models.checkpoint import HF_DIR
    from klalm.models.export import verify_export

    path = _local_path(value)
    if path is None:
        return
    flag = f"--model_args pretrained={value}"
    if not path.exists():
        raise FileNotFoundError(f"{flag}: no such folder")
    if path.is_file():
        raise FileNotFoundError(
            f"{flag} is a file; lm-eval loads Hugging Face export folders such as a run's {HF_DIR}/ "
            "(klalm-eval checkpoint=FILE evaluates a .ckpt)"
        )
    if not (path / "config.json").is_file():
        if (path / HF_DIR / "config.json").is_file():
            raise FileNotFoundError(f"{flag} is a training run folder: its export is pretrained={path / HF_DIR}")
        raise FileNotFoundError(f"{flag} holds no config.json: not a Hugging Face export folder")
    if verify_export(path):
        return
    # No SHA256SUMS (copied or edited by hand): a klalm model is loaded once here, refusing weights that do not fit
    # its config.json, which from_pretrained would fill with random values after a warning.
    try:
        model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return  # lm-eval says what is wrong with it
    if model_type == "klalm":
        from klalm.models.export import ExportIntegrityError, load_export_model

        try:
            load_export_model(path)  # the model is dropped: lm-eval loads its own
        except ExportIntegrityError:
            raise
        except Exception:  # noqa: BLE001  (an unreadable file: lm-eval's own load says what is wrong with it)
            return


def _check_local_tasks(tasks: list[str], include_path: str | None, metadata: Any) -> None:
    local = [name for name in tasks if name in LOCAL_TASK_NAMES]
    if not local:
        return
    if include_path is None:
        raise ConfigError(
            f'--tasks {",".join(local)}: klalm\'s local tasks need --include_path "$(klalm-eval --print-tasks-path)"'
        )
    if isinstance(metadata, str):  # a JSON object lm-eval did not parse
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError:
            metadata = None
    data_dir = metadata.get("data_dir") if isinstance(metadata, dict) else None
    if not data_dir:
        raise ConfigError(
            f"--tasks {','.join(local)}: klalm's local tasks read their data from a folder: pass "
            '--metadata \'{"data_dir": "../shared/data"}\' (the folder holding hellaswag/ and piqa/)'
        )
    for name in local:
        try:
            files = resolve_files(LOCAL_TASK_NAMES[name], data_dir)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"--metadata data_dir: {err}") from None
        user_name = next(key for key, task in TASKS.items() if task.name == name)
        try:
            check_local_rows(user_name, data_dir, files)
        except ConfigError as err:
            raise ConfigError(f"--metadata {err}") from None


def _check_model(name: str) -> None:
    import lm_eval.models  # noqa: F401  (registers lm-eval's model names, without importing the models)
    from lm_eval.api.registry import model_registry

    if name not in model_registry:
        names = sorted(model_registry.keys())
        close = difflib.get_close_matches(name, names, n=3)
        raise ConfigError(f"--model {name}: lm-eval has no such model (closest: {close}); valid: {', '.join(names)}")


def _check_output_path(value: str) -> None:
    """lm-eval writes its results only after the run, into the folder `value` (or, for a path ending in .json, beside
    it), and when it cannot it logs a warning and exits 0: the folder, or the nearest part of it that exists, must be
    a folder that takes a new file."""
    path = Path(value)
    existing = path.parent if path.suffix == ".json" else path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        hint = "" if path.suffix == ".json" else " (lm-eval writes into a folder, or beside a path ending in .json)"
        raise ConfigError(f"--output_path {value}: {existing} is a file, not a folder{hint}")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as err:
        raise ConfigError(f"--output_path {value}: cannot write in {existing} ({err.strerror or err})") from None


def check_run_args(args: Any) -> None:
    """Checks an `lm-eval run` namespace for what klalm knows about, before any model or task loads.

    Raises:
        FileNotFoundError: a local `pretrained=` that is missing, a file, a run folder or not an export; a local
            task file missing from data_dir.
        klalm.models.export.ExportIntegrityError: an export whose files differ from its SHA256SUMS.
        ConfigError: an unknown `--model`; a `--limit` not > 0; a `--batch_size` not a positive integer, 'auto' or
            'auto:N'; an `--output_path` that cannot be written; a local task without `--include_path` or without a
            `data_dir` in `--metadata`, or whose file there cannot be read.
    """
    if getattr(args, "model", None) is not None:
        _check_model(args.model)
    limit = getattr(args, "limit", None)
    if limit is not None and not 0 < limit < math.inf:
        raise ConfigError(f"--limit {limit:g} is invalid: must be > 0 (examples per task, or a fraction below 1)")
    batch_size = getattr(args, "batch_size", None)
    if batch_size is not None and not re.fullmatch(r"(auto(:0*[1-9]\d*)?|0*[1-9]\d*)", str(batch_size)):
        raise ConfigError(f"--batch_size {batch_size} is invalid: must be a positive integer, 'auto' or 'auto:N'")
    if getattr(args, "output_path", None):
        _check_output_path(args.output_path)
    model_args = getattr(args, "model_args", None)
    if isinstance(model_args, dict) and getattr(args, "model", None) in (None, "hf", "hf-auto", "huggingface"):
        _check_pretrained(model_args.get("pretrained"))
    if getattr(args, "config", None):  # a --config file may give the include path and metadata: lm-eval's to check
        return
    tasks = getattr(args, "tasks", None) or []
    if isinstance(tasks, str):
        tasks = tasks.split(",")
    _check_local_tasks(list(tasks), getattr(args, "include_path", None), getattr(args, "metadata", None))


def _raised_in(err: BaseException, module: str) -> bool:
    """Whether `err` was raised by code of `module` itself (not by something it called)."""
    frames = list(traceback.walk_tb(err.__traceback__))
    return bool(frames) and frames[-1][0].f_globals.get("__name__") == module


def cli_main(parser: Any, args: argparse.Namespace) -> None:
    """`klalm-lm-eval` once lm-eval's CLI (`parser`, its HarnessCLI) has parsed the arguments (`klalm.cli.lm_eval`):
    lm-eval runs them (same arguments) with klalm's model classes registered, after a one-line refusal
    (`klalm-lm-eval: ...`, exit code 1) of a bad `pretrained=` path, export, local task setup, model name, limit,
    batch size or output path, and of what lm-eval itself refuses while checking its arguments."""
    # Importing this module imported transformers, and with it klalm registered its config and model classes with
    # transformers' Auto classes (klalm/__init__.py), so lm-eval's `--model hf --model_args pretrained=<klalm export>`
    # finds them.
    from klalm.models.export import ExportIntegrityError

    if getattr(args, "command", None) == "run":
        try:
            check_run_args(args)
        except (ConfigError, OSError, ExportIntegrityError) as err:  # OSError: a missing or unreadable path
            sys.exit(f"klalm-lm-eval: {one_line(err)}")
    try:
        parser.execute(args)
    except (ValueError, TypeError, OSError) as err:
        if not _raised_in(err, "lm_eval.config.evaluate_config"):
            raise
        sys.exit(f"klalm-lm-eval: {one_line(err)}")  # lm-eval refused its arguments ("Tasks not found: ...")
