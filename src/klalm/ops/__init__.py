"""Sequence-mixing operators: the KLA scan (reference, parallel torch, Triton) and Mamba's selective scan."""

from klalm.ops.common import KLAState
from klalm.ops.scan import BACKENDS, kla_scan, kla_scan_logvar, kla_step
from klalm.ops.selective_scan import selective_scan

__all__ = ["BACKENDS", "KLAState", "kla_scan", "kla_scan_logvar", "kla_step", "selective_scan"]
