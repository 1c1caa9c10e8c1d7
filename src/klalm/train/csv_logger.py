"""The metrics CSV of a run folder, kept whole across resumes.

Lightning's `CSVLogger` deletes an existing `metrics.csv` when it starts. A resumed run continues in its run folder
(`klalm.train.resume`), so that would lose every earlier row; `ContinuingCSVLogger` keeps the file, adopts its
columns and appends. Rows logged after the step a run starts from (the tail a killed run wrote past its last
checkpoint) are dropped by `drop_rows_after` when training starts (`StepMetrics.on_train_start`), so the resumed
run logs those steps exactly once; a fresh run in a reused folder starts at step 0 and so starts a fresh table. A
resume from a run's last checkpoint trains nothing (that hook does not run): the final validation an earlier start
ran after that save, at a step that is not a validation step, is dropped by `drop_validation_rows_at` as the resumed
run validates the step again (`klalm.train.app.finish`).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from klalm.fileio import atomic_path


class _ContinuingWriter(ExperimentWriter):
    """Lightning's CSV writer, minus the deletion of an existing file at start."""

    def _check_log_dir_exists(self) -> None:
        """Adopts an existing file's columns (Lightning's version deletes the file here)."""
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as handle:
                self.metrics_keys = sorted(csv.DictReader(handle).fieldnames or [])


class ContinuingCSVLogger(CSVLogger):
    """`lightning.pytorch.loggers.CSVLogger` that appends to an existing `metrics.csv`; same arguments."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuingWriter(log_dir=self.log_dir)
        return self._experiment

    @rank_zero_only
    def drop_rows_after(self, step: int) -> None:
        """Removes the rows of steps after `step` from the file (rewritten atomically: a kill keeps the old one)."""
        self._drop_rows(lambda row: int(float(row["step"])) > step)

    @rank_zero_only
    def drop_validation_rows_at(self, step: int) -> None:
        """Removes the validation rows (val/loss set) of `step`, as `drop_rows_after` does: those an earlier start
        wrote after the checkpoint it resumes from (the final validation of a run whose last step is not a validation
        step comes after its last save), before the resumed run validates that step again."""
        self._drop_rows(lambda row: int(float(row["step"])) == step and bool(row.get("val/loss")))

    def _drop_rows(self, dropped: Callable[[dict[str, str]], bool]) -> None:
        path = self.experiment.metrics_file_path
        if not os.path.isfile(path):
            return
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            columns, rows = reader.fieldnames or [], list(reader)
        kept = [row for row in rows if not dropped(row)]
        if len(kept) == len(rows):
            return
        with atomic_path(path) as temporary, open(temporary, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(kept)
