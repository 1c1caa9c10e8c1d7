"""Hydra configs of klalm, shipped as the package `klalm.configs` (see pyproject.toml)."""
