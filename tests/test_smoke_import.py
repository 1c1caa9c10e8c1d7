"""The package imports and exposes its console entry points."""

import importlib.metadata
import subprocess
import sys
import textwrap

import pytest

import klalm


def test_version_matches_metadata():
    assert klalm.__version__ == importlib.metadata.version("klalm")


def test_console_scripts_are_declared():
    entry_points = importlib.metadata.entry_points(group="console_scripts")
    scripts = {ep.name for ep in entry_points if ep.value.startswith("klalm")}
    assert {"klalm-train", "klalm-eval", "klalm-params"} <= scripts


@pytest.mark.parametrize(
    "imports",
    [
        "import klalm",  # then transformers, as a user script does
        "import transformers; import klalm",
        "import klalm.models",
        "from klalm.models.hf import KLALMForCausalLM",
    ],
)
def test_import_klalm_is_light_and_registers_once_transformers_loads(imports):
    """`import klalm` loads no torch; AutoConfig knows "klalm" whichever import order a user takes."""
    code = textwrap.dedent(f"""
        import sys
        import klalm
        light = "torch" not in sys.modules
        {imports}
        from transformers import AutoConfig, AutoModelForCausalLM
        config = AutoConfig.for_model("klalm", arch="kla", d_model=32, n_layers=1, vocab_size=64)
        print(light, type(AutoModelForCausalLM.from_config(config)).__name__)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "KLALMForCausalLM"]
