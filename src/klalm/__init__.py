"""klalm: pretraining framework for Kalman Linear Attention language models and their baselines.

Importing klalm registers its Hugging Face classes with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(dir)` loads an exported klalm checkpoint.

The registration (at the end of `klalm.models`) needs transformers and torch, which take seconds to import. So
`import klalm` itself stays light: it imports klalm.models at once when transformers is already imported, and
otherwise as soon as transformers is first imported (`_RegisterAfterTransformers`). The console scripts
(`klalm.cli`) therefore compose and check their config, and answer `--help`, before anything heavy is loaded.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

__version__ = "0.1.0"


class _RegisterAfterTransformers(importlib.abc.MetaPathFinder):
    """Import hook: once the `transformers` module has executed, imports `klalm.models`, which registers the classes.

    It only wraps the loader of `transformers` itself and removes itself on first use. When klalm.models is the module
    importing transformers, `import_module` returns it half-built and klalm.models registers at its own end.
    """

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "transformers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the real spec, from the remaining finders
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module: Any) -> None:
            exec_module(module)
            importlib.import_module("klalm.models")

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


if "transformers" in sys.modules:
    importlib.import_module("klalm.models")
elif not any(isinstance(finder, _RegisterAfterTransformers) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterTransformers())
