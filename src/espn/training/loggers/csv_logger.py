"""The CSV logger: ``steps.csv``, ``epochs.csv`` and ``tasks.csv``, rewritten atomically and
continued by a resumed run (columns and behaviour: docs/logging.md).
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from espn.training.callbacks import EpochEnd, StepEnd
from espn.training.loggers.base import DEFAULT_LOG_EVERY, LoggerError, MetricLogger, TaskRecord
from espn.utils.io import read_csv, write_csv

STEP_COLUMNS = ["task", "phase", "step", "loss", "lr", "elapsed_seconds"]
EPOCH_COLUMNS = ["task", "phase", "epoch", "n_epochs", "step", "loss", "seconds", "elapsed_seconds"]
TASK_TAIL = ["average_accuracy", "flops_ratio", "used_weights", "new_weights", "seconds"]

Row = dict[str, Any]


def _rows(path: Path, keys: Sequence[str]) -> list[Row]:
    """The rows already in ``path`` (none if it is not there), each with whole numbers in
    ``keys``; a file that is not such a table is a :class:`LoggerError` naming it."""
    if not path.is_file():
        return []
    try:
        rows = [dict(r) for r in read_csv(path)]
        for r in rows:
            for key in keys:
                int(r[key])
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, csv.Error) as exc:
        raise LoggerError(
            f"{path} is not a table the CSV logger wrote ({type(exc).__name__}: {exc}); "
            "move it away or delete it to start a new one"
        ) from None
    return rows


def _row(event: StepEnd | EpochEnd, columns: Sequence[str], **values: float) -> Row:
    """The ``columns`` of ``event``, those given in ``values`` from there."""
    return {c: values[c] if c in values else getattr(event, c) for c in columns}


def _before(rows: list[Row], task: int, step: int) -> list[Row]:
    """The rows that come before step ``step`` of task ``task``."""
    return [
        r
        for r in rows
        if int(r["task"]) < task or (int(r["task"]) == task and int(r["step"]) < step)
    ]


class CSVLogger(MetricLogger):
    """Steps, epochs and tasks as CSV files in ``directory``."""

    name: ClassVar[str] = "csv"

    def __init__(self, directory: Path | str, *, log_every: int = DEFAULT_LOG_EVERY) -> None:
        super().__init__(directory, log_every=log_every)
        self.steps_path = self.directory / "steps.csv"
        self.epochs_path = self.directory / "epochs.csv"
        self.tasks_path = self.directory / "tasks.csv"
        self._steps = _rows(self.steps_path, ["task", "step"])
        self._epochs = _rows(self.epochs_path, ["task", "step"])
        self._tasks = _rows(self.tasks_path, ["task"])
        self._started: set[int] = set()  # tasks seen in this process

    def _begin(self, task: int, step: int) -> None:
        """On a task's first event in this process: forget the rows it will write again."""
        if task in self._started:
            return
        self._started.add(task)
        self._steps = _before(self._steps, task, step)
        self._epochs = _before(self._epochs, task, step)
        self._tasks = [r for r in self._tasks if int(r["task"]) < task]

    def on_step_end(self, learner: Any, event: StepEnd) -> None:
        self._begin(event.task, event.step)  # every step (no device read): the exact resume point
        super().on_step_end(learner, event)

    def log_step(self, event: StepEnd, loss: float, elapsed: float) -> None:
        self._steps.append(_row(event, STEP_COLUMNS, loss=loss, elapsed_seconds=elapsed))

    def log_epoch(self, event: EpochEnd, elapsed: float) -> None:
        self._begin(event.task, event.step + 1)
        self._epochs.append(_row(event, EPOCH_COLUMNS, elapsed_seconds=elapsed))
        self._write_steps()

    def log_task(self, record: TaskRecord) -> None:
        self._begin(record.task, sys.maxsize)  # committed with no step here: keep its steps
        row: Row = {
            "task": record.task,
            "name": record.name,
            **{f"accuracy_{j}": a for j, a in enumerate(record.row or [])},
            **{key: getattr(record, key) for key in [*TASK_TAIL, "elapsed_seconds"]},
        }
        self._tasks = [r for r in self._tasks if int(r["task"]) != record.task] + [row]
        self._write_steps()
        n = max(int(r["task"]) for r in self._tasks) + 1
        columns = ["task", "name", *(f"accuracy_{j}" for j in range(n)), *TASK_TAIL]
        write_csv(self.tasks_path, self._tasks, [*columns, "elapsed_seconds"])

    def _write_steps(self) -> None:
        write_csv(self.steps_path, self._steps, STEP_COLUMNS)
        write_csv(self.epochs_path, self._epochs, EPOCH_COLUMNS)

    def close(self) -> None:
        if self._steps or self._epochs:
            self._write_steps()
