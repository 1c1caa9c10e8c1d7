"""Shared pytest setup: GPU tests skip cleanly without CUDA; Triton kernels run interpreted without CUDA; the real
data folder is found once.

TRITON_INTERPRET is read when a `@triton.jit` function is defined, so it is set here, before any test module (or the
package code they import, e.g. fla or klalm.kernels) imports Triton.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("KLALM_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (or $KLALM_SHARED_DATA); tests that need it skip, naming the path, if it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (set KLALM_SHARED_DATA)")
    return SHARED_DATA
