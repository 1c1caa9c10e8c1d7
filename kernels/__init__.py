"""Triton kernels, importable as `klalm.kernels`; each is reached through its op in `klalm.ops`."""
