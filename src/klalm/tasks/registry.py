"""The synthetic tasks by name: A5 state tracking, Zoology MQAR and the six MAD-Lab tasks.

    from klalm.tasks.registry import make_task
    from klalm.tasks.base import TaskDataset
    task = make_task("mqar", length=256, num_pairs=16)
    test = TaskDataset(task, num_examples=3000, seed=0, split="test")
    test[0]  # {"input_ids": LongTensor[256], "labels": LongTensor[256]}, labels -100 where not scored

A task is a dataclass of its settings (klalm.tasks.base.SyntheticTask); `make_task` refuses a name or a setting it
does not have, naming the valid ones.
"""

from __future__ import annotations

import dataclasses

from klalm.config_checks import MAD_TASKS
from klalm.tasks.a5 import A5Task
from klalm.tasks.base import SyntheticTask
from klalm.tasks.mad import (
    CompressionTask,
    FuzzyRecallTask,
    InContextRecallTask,
    MemorizationTask,
    NoisyRecallTask,
    SelectiveCopyTask,
)
from klalm.tasks.mqar import MQARTask

# The MAD-Lab tasks in the order of their names, MAD_TASKS (in klalm.config_checks: a command line reads them there,
# without torch).
_MAD_CLASSES = (
    InContextRecallTask,
    NoisyRecallTask,
    FuzzyRecallTask,
    SelectiveCopyTask,
    CompressionTask,
    MemorizationTask,
)
TASKS: dict[str, type[SyntheticTask]] = {
    "a5": A5Task,
    "mqar": MQARTask,
    **dict(zip(MAD_TASKS, _MAD_CLASSES, strict=True)),
}


def make_task(name: str, **settings) -> SyntheticTask:
    """Build a task by registry name; `settings` override its fields (e.g. length, num_pairs)."""
    if name not in TASKS:
        raise KeyError(f"unknown synthetic task {name!r}; valid: {sorted(TASKS)}")
    fields = sorted(f.name for f in dataclasses.fields(TASKS[name]))
    unknown = sorted(set(settings) - set(fields))
    if unknown:
        raise KeyError(f"task {name!r} has no settings {unknown}; valid: {fields}")
    return TASKS[name](**settings)
