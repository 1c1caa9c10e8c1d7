"""Kernel tests run on the GPU when there is one, else under Triton's CPU interpreter.

TRITON_INTERPRET must be set before the kernel modules are first imported, so it is set here, at
collection time, before the test modules of this folder import `klalm.kernels`.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def device() -> torch.device:
    """cuda when available, else cpu (the kernels then run interpreted: keep shapes tiny)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
