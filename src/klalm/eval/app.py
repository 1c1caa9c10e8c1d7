"""`klalm-eval`: Hydra app for zero-shot lm-eval of checkpoints (configs/eval.yaml; any key overridable).

klalm-eval checkpoint=runs/export tasks=[hellaswag,piqa] data_dir=../shared/data limit=100
klalm-eval 'checkpoint=[runs/a/export,runs/b/last.ckpt]' batch_size=32 log_samples=true
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig, ListConfig, OmegaConf

from klalm.eval.runner import evaluate_checkpoints

log = logging.getLogger(__name__)


def _as_list(value: object) -> list[str]:
    """A single path or a list of paths from the command line, as a list of strings."""
    if isinstance(value, (ListConfig, list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def run(cfg: DictConfig) -> dict:
    """Evaluate the checkpoints named in `cfg` (keys of configs/eval.yaml); returns the results.json document."""
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


@hydra.main(config_path="pkg://klalm.configs", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Console entry point; prints the Markdown comparison table at the end."""
    log.info("config:\n%s", OmegaConf.to_yaml(cfg))
    report = run(cfg)
    from klalm.eval.report import markdown_table

    print(markdown_table(report))


if __name__ == "__main__":
    main()
