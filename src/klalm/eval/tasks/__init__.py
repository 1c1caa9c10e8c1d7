"""Local lm-eval task definitions that read HellaSwag and PIQA from a data folder instead of the hub.

Each entry of `TASKS` maps the user-facing name (the upstream lm-eval task it reproduces) to its local
definition: the task YAML in this folder and the files it needs under `data_dir` (the layout of
../shared/data). `lm_eval.tasks.TaskManager(include_path=TASKS_DIR, metadata={"data_dir": ...})` registers
them; the loaders in `klalm.eval.tasks.utils` read `data_dir` from that metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class LocalTask:
    """One local task.

    Attributes:
        name: lm-eval task name of the local definition (never clashes with an upstream name).
        yaml: file name of its task YAML in `TASKS_DIR`.
        files: files it reads, relative to `data_dir`; each entry lists accepted alternatives in order.
    """

    name: str
    yaml: str
    files: tuple[tuple[str, ...], ...]


TASKS: dict[str, LocalTask] = {
    "hellaswag": LocalTask(
        name="hellaswag_local",
        yaml="hellaswag_local.yaml",
        files=(("hellaswag/hellaswag_val.jsonl", "hellaswag/hellaswag_val.jsonl.gz"),),
    ),
    "piqa": LocalTask(
        name="piqa_local",
        yaml="piqa_local.yaml",
        files=(("piqa/valid.jsonl",), ("piqa/valid-labels.lst",)),
    ),
}


def get_local_task(name: str) -> LocalTask:
    """The local task for a user-facing name ("hellaswag") or a local name ("hellaswag_local").

    Raises:
        KeyError: `name` has no local definition; the message lists the valid names.
    """
    by_local_name = {task.name: task for task in TASKS.values()}
    task = TASKS.get(name) or by_local_name.get(name)
    if task is None:
        raise KeyError(f"no local task {name!r}; valid: {sorted(TASKS)} (or {sorted(by_local_name)})")
    return task


def resolve_files(task: LocalTask, data_dir: str | Path) -> list[Path]:
    """The files `task` reads, found under `data_dir`.

    Raises:
        FileNotFoundError: `data_dir` is not a folder, or a required file is missing (named, with alternatives).
    """
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"data_dir {str(root)!r} is not a folder")
    found = []
    for alternatives in task.files:
        path = next((root / rel for rel in alternatives if (root / rel).is_file()), None)
        if path is None:
            wanted = " or ".join(str(root / rel) for rel in alternatives)
            raise FileNotFoundError(f"task {task.name!r} needs {wanted}, which does not exist")
        found.append(path)
    return found
