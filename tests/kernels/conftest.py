"""Kernel tests run on the GPU when there is one, else under Triton's CPU interpreter (tests/conftest.py sets
TRITON_INTERPRET before anything imports Triton)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def device() -> torch.device:
    """cuda when available, else cpu (the kernels then run interpreted: keep shapes tiny)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
