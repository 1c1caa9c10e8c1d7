"""Hydra configs of klalm, shipped as the package `klalm.configs` (see pyproject.toml).

Importing the package registers the resolvers the configs use, so every way of composing them (`pkg://klalm.configs`,
`initialize_config_module("klalm.configs")`) finds them.
"""

import glob
import math

from omegaconf import OmegaConf

from klalm.train.rundir import (
    config_subdir,
    eval_config_subdir,
    eval_dir,
    fresh_run_name,
    log_file,
    new_folder,
    run_dir_for,
)

# `${mul:a,b,...}`: products in configs, e.g. a token budget of N global batches (configs/debug/fast.yaml).
OmegaConf.register_new_resolver("mul", lambda *factors: math.prod(factors), replace=True)
# Run folders (configs/hydra/default.yaml, configs/eval.yaml): this process's unique new folder name, the folder a run
# (or a resume) writes to, where each start's config goes, its log file, and a new folder named by its path. Cached:
# Hydra and Lightning's launcher both resolve the run folder.
OmegaConf.register_new_resolver("klalm_fresh_name", fresh_run_name, replace=True)
OmegaConf.register_new_resolver("klalm_run_dir", run_dir_for, use_cache=True, replace=True)
OmegaConf.register_new_resolver("klalm_new_folder", new_folder, replace=True)  # a new folder given by its path
OmegaConf.register_new_resolver("klalm_config_subdir", config_subdir, replace=True)
OmegaConf.register_new_resolver("klalm_log_file", log_file, replace=True)
# klalm-eval's folder: its output_dir, else a new outputs/eval/<time>_<hex>; its config record, beside an earlier one
OmegaConf.register_new_resolver("klalm_eval_dir", eval_dir, replace=True)
OmegaConf.register_new_resolver("klalm_eval_config_subdir", eval_config_subdir, replace=True)
# `${klalm_glob_escape:path}`: a path matched literally in a glob (paths.resume_glob: a run_name like "g[1]")
OmegaConf.register_new_resolver("klalm_glob_escape", glob.escape, replace=True)
