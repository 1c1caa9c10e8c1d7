"""Shared pytest setup: GPU tests skip cleanly without CUDA; Triton kernels run interpreted without CUDA; the real
data folder is found once.

TRITON_INTERPRET is read when a `@triton.jit` function is defined, so it is set here, before any test module (or the
package code they import, e.g. fla or klalm.kernels) imports Triton.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# One intra-op thread per test process of `make test`'s workers and the processes they start (unless OMP_NUM_THREADS
# is set; not in a single-process run, e.g. the GPU tests on a many-core host): the tests' tensors are tiny, and the
# two workers on two cores each spun a second OpenMP thread that only waited. With one, tests/tasks/test_training.py's
# beats-chance runs took 5.5 s of CPU instead of 26.5 s (2026-12-06, 2 cores). The variable must be set before torch
# (and its OpenMP runtime) loads; torch.set_num_threads also covers a plugin that imported torch first.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def _patch_language_once_per_launch() -> None:
    """Under TRITON_INTERPRET=1, patch triton.language once per kernel launch, not again at every call of a nested
    `@triton.jit` helper (the interpreted kernel tests spend most of their time on that re-patching).

    Written for Triton 3.9.0's triton/runtime/interpreter.py: a launch (GridExecutor.__call__) patches the language
    modules that the kernel's module sees (tl and/or tl.core) with `_patch_lang(kernel)` and restores them when it
    ends; every helper call (InterpretedFunction.__call__) runs `_patch_lang(helper)` again, an inspect.getmembers walk
    of triton.language, its tensor class and math module that re-sets the patch already in place (and drops the
    returned scope, restoring nothing). Here a helper call still patches when it sees a language module the running
    launch has not patched (as before), else it reuses the launch's patch. Other Triton internals: nothing changes.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import triton.language as tl
        from triton.runtime import interpreter

        launch, patch_lang, empty_scope = interpreter.GridExecutor, interpreter._patch_lang, interpreter._LangPatchScope
        calls = (launch.__call__, interpreter.InterpretedFunction.__call__)
        if not all("_patch_lang" in call.__code__.co_names for call in calls):
            return  # a Triton whose launch or helper call does not go through _patch_lang: nothing to do
    except (ImportError, AttributeError):
        return  # a Triton without these internals
    launch_call = launch.__call__
    patched = set()  # the language modules patched by the running launch; empty between launches

    def patch_lang_once(fn):
        langs = {value for value in fn.__globals__.values() if value is tl or value is tl.core}
        if langs and langs <= patched:
            return empty_scope()  # already patched by this launch: an empty scope, nothing to restore
        patched.update(langs)
        return patch_lang(fn)

    def launch_once(self, *args, **kwargs):
        patched.clear()
        try:
            return launch_call(self, *args, **kwargs)  # its `_patch_lang(kernel)` is patch_lang_once's first call
        finally:
            patched.clear()  # the launch has restored the language

    interpreter._patch_lang = patch_lang_once
    launch.__call__ = launch_once


_patch_language_once_per_launch()

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("KLALM_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _process_state_restored():
    """What a test may change for the whole worker process comes back after it: Lightning's
    `Trainer(deterministic=True)` (the train tests' TINY) turns torch's deterministic algorithms on and leaves them
    on, and a fit stopped by an exception may leave a Ctrl-C handler; a later test in the same worker then started
    from them (tests/tasks/test_runner.py's check that a block restores the setting failed in some orders)."""
    import signal

    deterministic = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    ctrl_c = signal.getsignal(signal.SIGINT)
    yield
    torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    signal.signal(signal.SIGINT, ctrl_c)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (or $KLALM_SHARED_DATA); tests that need it skip, naming the path, if it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (set KLALM_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture
def console_in_fresh_python():
    """Runs `klalm.cli.<entry>()` with `argv` in a new interpreter, as its console script `prog` would; the process's
    stdout ends with `exit <code>` and `heavy [...]`, the modules of `heavy` it imported."""

    def run(entry: str, prog: str, argv: list[str], heavy: tuple[str, ...]) -> subprocess.CompletedProcess:
        script = (
            f"import sys; from klalm.cli import {entry}; sys.argv[0] = {prog!r}\n"
            f"try:\n    {entry}()\nexcept SystemExit as exit_:\n    print('exit', exit_.code)\n"
            f"print('heavy', [name for name in {heavy!r} if name in sys.modules])"
        )
        return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120)

    return run


@pytest.fixture
def savefig_cut_off(monkeypatch):
    """matplotlib's `Figure.savefig` made to write part of an image into its target and fail there (OSError "cut off
    mid-write"), as a process killed mid-write leaves it: a plot written in place was left truncated. The figure is
    left open: closing it is the caller's (pyplot keeps a figure whose save failed, if not)."""
    from matplotlib.figure import Figure

    def cut_off(self, fname, **kwargs):
        if isinstance(fname, (str, os.PathLike)):
            Path(fname).write_bytes(b"\x89PNG part")
        else:
            fname.write(b"\x89PNG part")
        raise OSError("cut off mid-write")

    monkeypatch.setattr(Figure, "savefig", cut_off)
