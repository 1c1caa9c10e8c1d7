"""Triton kernels, importable as `klalm.kernels`; each is reached through its op in `klalm.ops`.

mobius_scan (KLA scan, backend "triton" of `klalm.ops.kla_scan`) and selective_scan (Mamba-1, backend "triton" of
`klalm.ops.selective_scan`); measured numbers and design notes in kernels/NOTES.md.
"""
