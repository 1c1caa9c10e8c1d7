"""What `klalm-eval` runs: zero-shot lm-eval of the checkpoints named in a composed configs/eval.yaml.

Examples:
    klalm-eval checkpoint=runs/export tasks=[hellaswag,piqa] data_dir=../shared/data limit=100
    klalm-eval 'checkpoint=[runs/a/export,runs/b/last.ckpt]' batch_size=32 log_samples=true

The console script itself (composition, checks, `--help`, `--print-tasks-path`) is `klalm.cli.evaluate`.
"""

from __future__ import annotations

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig

from klalm.config_checks import ConfigError, check_eval_config
from klalm.eval.checkpoint import resolve_dtype
from klalm.eval.runner import evaluate_checkpoints
from klalm.eval.tasks import get_local_task


def _as_list(value: object) -> list[str]:
    """A single path or a list of paths from the command line, as a list of strings."""
    if isinstance(value, (ListConfig, list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def run(cfg: DictConfig) -> dict:
    """Evaluate the checkpoints named in `cfg` (keys of configs/eval.yaml); returns the results.json document.
    output_dir=null writes into the Hydra run's folder (`hydra.run.dir`: a new outputs/eval/<time>_<hex>)."""
    check_eval_config(cfg)
    check_names(cfg)
    return evaluate_checkpoints(
        _as_list(cfg.checkpoint),
        _as_list(cfg.tasks),
        output_dir=cfg.output_dir if cfg.output_dir is not None else HydraConfig.get().runtime.output_dir,
        data_dir=cfg.data_dir,
        limit=cfg.limit,
        batch_size=cfg.batch_size,
        max_length=cfg.max_length,
        device=cfg.device,
        dtype=cfg.dtype,
        tokenizer=cfg.tokenizer,
        log_samples=cfg.log_samples,
    )


def check_names(cfg: DictConfig) -> None:
    """The dtype and, with `data_dir`, the task names, before any model loads: an unknown one is a ConfigError naming
    the key and the valid names (where the library raises KeyError). Upstream task names (no data_dir) and an empty or
    repeated task list are `klalm.eval.harness.resolve_tasks`'s to check (a ConfigError too)."""
    try:
        resolve_dtype(cfg.dtype)
    except KeyError as err:
        raise ConfigError(f"dtype: {err.args[0]}") from None
    if cfg.data_dir is not None:
        for name in _as_list(cfg.tasks):
            try:
                get_local_task(name)
            except KeyError as err:
                raise ConfigError(f"tasks: {err.args[0]}") from None
