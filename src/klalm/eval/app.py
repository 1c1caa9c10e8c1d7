"""What `klalm-eval` runs: zero-shot lm-eval of the checkpoints named in a composed configs/eval.yaml.

Examples:
    klalm-eval checkpoint=runs/export tasks=[hellaswag,piqa] data_dir=../shared/data limit=100
    klalm-eval 'checkpoint=[runs/a/export,runs/b/last.ckpt]' batch_size=32 log_samples=true

The console script itself (composition, checks, `--help`, `--print-tasks-path`) is `klalm.cli.evaluate`.
"""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig

from klalm.config_checks import check_eval_config
from klalm.eval.runner import evaluate_checkpoints


def _as_list(value: object) -> list[str]:
    """A single path or a list of paths from the command line, as a list of strings."""
    if isinstance(value, (ListConfig, list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def run(cfg: DictConfig) -> dict:
    """Evaluate the checkpoints named in `cfg` (keys of configs/eval.yaml); returns the results.json document."""
    check_eval_config(cfg)
    return evaluate_checkpoints(
        _as_list(cfg.checkpoint),
        _as_list(cfg.tasks),
        output_dir=cfg.output_dir,
        data_dir=cfg.data_dir,
        limit=cfg.limit,
        batch_size=cfg.batch_size,
        max_length=cfg.max_length,
        device=cfg.device,
        dtype=cfg.dtype,
        tokenizer=cfg.tokenizer,
        log_samples=cfg.log_samples,
    )
