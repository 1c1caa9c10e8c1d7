"""`klalm-eval`: Hydra app for zero-shot lm-eval of checkpoints (configs/eval.yaml; any key overridable).

Examples:
    klalm-eval checkpoint=runs/export tasks=[hellaswag,piqa] data_dir=../shared/data limit=100
    klalm-eval 'checkpoint=[runs/a/export,runs/b/last.ckpt]' batch_size=32 log_samples=true

The config is configs/eval.yaml (package `klalm.configs`), registered in Hydra's ConfigStore; the app's search
path is the empty package `klalm.eval.hydra_root`. Hydra treats every folder on its search path as a config group,
so a folder named like an eval key would turn e.g. `tasks=[...]` into a group override: `pkg://klalm.eval` (what
`config_path=None` searches) has the local lm-eval tasks in tasks/.
"""

from __future__ import annotations

import logging
from importlib.resources import files

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from klalm.eval.report import markdown_table
from klalm.eval.runner import evaluate_checkpoints

log = logging.getLogger(__name__)

CONFIG_NAME = "eval"


def register_config() -> None:
    """Store configs/eval.yaml in Hydra's ConfigStore under `CONFIG_NAME` (idempotent)."""
    text = files("klalm.configs").joinpath(f"{CONFIG_NAME}.yaml").read_text(encoding="utf-8")
    ConfigStore.instance().store(name=CONFIG_NAME, node=OmegaConf.create(text))


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


@hydra.main(config_path="pkg://klalm.eval.hydra_root", config_name=CONFIG_NAME, version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    log.info("config:\n%s", OmegaConf.to_yaml(cfg))
    print(markdown_table(run(cfg)))


def main() -> None:
    """Console entry point (`klalm-eval`); prints the Markdown comparison table at the end."""
    register_config()
    _hydra_main()


if __name__ == "__main__":
    main()
