"""The TensorBoard logger (``torch.utils.tensorboard``; the optional extra ``tensorboard``).

Event files go to its directory (``RUN/logs/tensorboard`` for ``--log tensorboard``; view with
``tensorboard --logdir RUN/logs``). Tags, each task a curve of its own:

- ``loss/task_T``, ``lr/task_T`` against the task's step, every ``log_every`` steps, and
  ``phase/task_T`` (text) at the first logged step of each of its phases;
- ``epoch_loss/task_T`` against the step at the end of each epoch;
- against the task just learned ``T``: ``accuracy/task_J`` (task J's accuracy after learning
  task T, J <= T), ``accuracy/average``, ``flops_ratio``, ``weights/used``, ``weights/new``,
  ``time/task_seconds`` and ``time/elapsed_seconds``.

A resumed run appends a new event file to the same directory; TensorBoard drops the points it
repeats (a tag whose step goes back replaces the points from there on).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from espn.training.loggers.base import (
    DEFAULT_LOG_EVERY,
    EpochRecord,
    MetricLogger,
    StepRecord,
    TaskRecord,
)


class TensorBoardLogger(MetricLogger):
    """Steps, epochs and tasks as TensorBoard scalars in ``directory``."""

    name: ClassVar[str] = "tensorboard"
    folder: ClassVar[str] = "tensorboard"
    extra: ClassVar[tuple[str, str] | None] = ("tensorboard", "tensorboard")

    def __init__(self, directory: Path | str, *, log_every: int = DEFAULT_LOG_EVERY) -> None:
        super().__init__(log_every=log_every)
        self.check_available()
        self.directory = Path(directory)
        self._writer: Any = None
        self._phase: dict[int, str] = {}

    @classmethod
    def in_run(cls, run_dir: Path, *, log_every: int = DEFAULT_LOG_EVERY) -> TensorBoardLogger:
        return cls(Path(run_dir) / "logs" / cls.folder, log_every=log_every)

    @property
    def writer(self) -> Any:
        """The ``SummaryWriter``, opened on first use (no empty event file otherwise)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.directory))
        return self._writer

    def log_step(self, record: StepRecord) -> None:
        t, step = record.task, record.step
        if self._phase.get(t) != record.phase:
            self._phase[t] = record.phase
            self.writer.add_text(f"phase/task_{t}", record.phase, step)
        self.writer.add_scalar(f"loss/task_{t}", record.loss, step)
        self.writer.add_scalar(f"lr/task_{t}", record.lr, step)

    def log_epoch(self, record: EpochRecord) -> None:
        self.writer.add_scalar(f"epoch_loss/task_{record.task}", record.loss, record.step)
        self.writer.flush()

    def log_task(self, record: TaskRecord) -> None:
        t, w = record.task, self.writer
        for j, accuracy in enumerate(record.row or []):
            w.add_scalar(f"accuracy/task_{j}", accuracy, t)
        for tag, value in record.scalars().items():
            w.add_scalar(tag, value, t)
        w.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
