"""Hydra's primary search path for `klalm-eval`: deliberately empty.

Hydra treats every folder on its search path as a config group, and `@hydra.main` with `config_path=None` still
searches the calling module's package (`klalm.eval`, whose `tasks/` folder would then shadow the `tasks` key).
Pointing the app here, at a package with no folders, leaves only the config that `klalm.eval.app` registers from
configs/eval.yaml in Hydra's ConfigStore.
"""
