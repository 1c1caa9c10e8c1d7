"""Evaluate one or more checkpoints zero-shot and write the report (the work behind `klalm-eval`).

All input checks (every checkpoint's kind and files, the tokenizer path, task names, data files, dtype, sizes, the
output folder) run before any model is loaded, so a typo fails in seconds instead of after the first model's
evaluation; a checkpoint that still fails later (its load, or an answer longer than max_length) writes the report
of the checkpoints before it, then raises.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from klalm.config_checks import ConfigError
from klalm.data.hub import check_hub
from klalm.eval.checkpoint import check_checkpoint, check_tokenizer, load_checkpoint, resolve_device, resolve_dtype
from klalm.eval.harness import evaluate_model, resolve_tasks
from klalm.eval.report import build_report, checkpoint_labels, write_report, write_samples

log = logging.getLogger(__name__)


def _check_sizes(limit: int | None, batch_size: int, max_length: int) -> None:
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of examples or null, got {limit}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")


def _make_output_dir(output_dir: str | Path) -> Path:
    """Creates `output_dir` before any model loads, so that a folder that cannot be made fails in seconds."""
    out = Path(output_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir={str(out)!r} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"output_dir={str(out)!r} cannot be created: {err.strerror or err}") from None
    return out


def _tokenizer_setting(tokenizer: str | Path | None) -> str | None:
    """What results.json records of `tokenizer=`: a folder by its absolute path, a hub id as given, None for the
    checkpoints' own tokenizers."""
    if tokenizer is None:
        return None
    path = Path(tokenizer).expanduser()
    return str(path.resolve()) if path.is_dir() else str(tokenizer)


def evaluate_checkpoints(
    checkpoints: Sequence[str | Path],
    tasks: Sequence[str],
    *,
    output_dir: str | Path,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = 16,
    max_length: int = 2048,
    device: str = "auto",
    dtype: str = "float32",
    tokenizer: str | Path | None = None,
    log_samples: bool = False,
) -> dict[str, Any]:
    """Zero-shot lm-eval of every checkpoint on every task; writes results.json, results.md (and samples).

    Args:
        checkpoints: HF export folders, Lightning `.ckpt` files or training run folders (mixed freely).
        tasks: user-facing task names, e.g. ["hellaswag", "piqa"].
        output_dir: where results.json, results.md and samples_*.jsonl go (created; the samples files of an earlier
            evaluation there that this one's results.json does not name are removed with its report).
        data_dir: local data folder (layout of ../shared/data) → offline local tasks; None → upstream hub tasks.
        limit: at most this many examples per task (the first ones); None = the whole validation set.
        batch_size: lm-eval requests per forward pass.
        max_length: model context in tokens given to lm-eval (requests are left-truncated to it; each whole answer
            must fit, or `evaluate_model` raises ConfigError).
        device: "auto" (CUDA if available), "cpu", "cuda", "cuda:N".
        dtype: weight dtype ("float32", "bfloat16", "float16", "float64").
        tokenizer: tokenizer folder overriding the checkpoints' own.
        log_samples: also write lm-eval's per-sample records.

    Returns:
        The results.json document (see `klalm.eval.report`).

    Raises:
        ValueError: empty checkpoint or task list, or non-positive sizes.
        FileNotFoundError: a missing checkpoint or tokenizer folder, data_dir without a file a task needs, or no
            data_dir on a machine that cannot reach the Hugging Face hub (`klalm.data.hub.HubUnreachableError`).
        CheckpointError, ExportIntegrityError: a checkpoint that cannot be read or whose files changed.
        ConfigError: an output_dir that cannot be created, or an upstream task lm-eval does not have.
        KeyError: an unknown local task or dtype (valid names listed).
    """
    checkpoints = [Path(c).expanduser() for c in checkpoints]
    if not checkpoints:
        raise ValueError("checkpoint is empty: give a path or a list of paths")
    _check_sizes(limit, batch_size, max_length)
    resolve_dtype(dtype)
    kinds = [check_checkpoint(c) for c in checkpoints]
    check_tokenizer(tokenizer)
    if data_dir is None:  # lm-eval's hub tasks download their datasets after the model loads, retrying each file
        check_hub(
            f"evaluating the hub tasks {list(tasks)}",
            "give data_dir (a local data folder) for the offline local tasks, or set HF_HUB_OFFLINE=1 to use their "
            "datasets from the Hugging Face cache",
            from_cache=True,
        )
    specs, task_manager = resolve_tasks(list(tasks), data_dir)
    labels = checkpoint_labels(checkpoints)
    target = str(resolve_device(device))
    output_dir = _make_output_dir(output_dir)
    log.info("evaluating %d checkpoint(s) (%s) on %s", len(checkpoints), ", ".join(kinds), [s.name for s in specs])

    settings = {
        "limit": limit,
        "num_fewshot": 0,
        "batch_size": batch_size,
        "max_length": max_length,
        "log_samples": log_samples,
        "data_dir": None if data_dir is None else str(Path(data_dir).expanduser().resolve()),
        "tokenizer": _tokenizer_setting(tokenizer),
    }
    results, models = {}, {}
    for label, path in tqdm(list(zip(labels, checkpoints)), desc="checkpoints", unit="ckpt"):
        try:
            loaded = load_checkpoint(path, tokenizer=tokenizer, device=target, dtype=dtype)
            metrics, samples = evaluate_model(
                loaded.model,
                loaded.tokenizer,
                specs,
                task_manager,
                limit=limit,
                batch_size=batch_size,
                max_length=max_length,
                log_samples=log_samples,
            )
        except BaseException:  # a load or lm-eval refusal (or Ctrl-C): the checkpoints before it keep theirs
            if results:
                log.warning("stopped at %s: the report holds the %d checkpoint(s) before it", path, len(results))
                write_report(build_report(results, models, specs, settings), output_dir)
            raise
        results[label], models[label] = metrics, loaded.provenance
        if log_samples:
            write_samples(samples, label, output_dir)
        del loaded
    report = build_report(results, models, specs, settings)
    json_path, md_path = write_report(report, output_dir)
    log.info("wrote %s and %s", json_path, md_path)
    return report
