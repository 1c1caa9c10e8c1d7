"""The package imports and exposes its console entry points."""

import importlib.metadata

import klalm


def test_version_matches_metadata():
    assert klalm.__version__ == importlib.metadata.version("klalm")


def test_console_scripts_are_declared():
    entry_points = importlib.metadata.entry_points(group="console_scripts")
    scripts = {ep.name for ep in entry_points if ep.value.startswith("klalm")}
    assert {"klalm-train", "klalm-eval", "klalm-params"} <= scripts
