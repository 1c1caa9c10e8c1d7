"""Triton kernels, importable as `klalm.kernels`; each is reached through its op in `klalm.ops`.

mobius_scan (KLA scan, backend "triton" of `klalm.ops.kla_scan` and `kla_scan_logvar`) and selective_scan (Mamba-1,
backend "triton" of `klalm.ops.selective_scan`), both torch custom ops with a time-parallel split at small B·M·S;
common holds what they share. Measured numbers and design notes in kernels/NOTES.md.
"""
