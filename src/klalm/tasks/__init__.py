"""Synthetic benchmarks of the KLA paper: A5 state tracking, Zoology MQAR and the six MAD-Lab tasks.

The generators (`a5`, `mqar`, `mad`, on `base`) and their registry by name (`registry.make_task`); a unit of work and
the identity of its result rows (`cells`), how it trains and runs (`train`, `units`), the grid's plans (`plans`), the
results and state folders (`results`, `states`), time estimates (`estimates`), tables and plots (`report`).
`scripts/run_synthetic.py` (`klalm-synthetic`: `runner`, and `folders` for its verbs that only move or read files)
trains models on them and writes tables and plots.

The package imports none of its modules: `klalm-synthetic merge` and `pack` read and write results and state files
with `results`, `states` and `folders` alone, and `positions` and `curves` read a results folder with those, `report`
and `plans`, all without torch (seconds of imports on a machine whose time is budgeted).
"""
