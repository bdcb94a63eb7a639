"""The TensorBoard logger (``torch.utils.tensorboard``; the optional extra ``tensorboard``):
each task a curve of its own (tags: docs/logging.md). A resumed run appends a new event file
to the same directory; TensorBoard drops the points it repeats.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from espn.training.callbacks import EpochEnd, StepEnd
from espn.training.loggers.base import DEFAULT_LOG_EVERY, MetricLogger, TaskRecord


class TensorBoardLogger(MetricLogger):
    """Steps, epochs and tasks as TensorBoard scalars in ``directory``."""

    name: ClassVar[str] = "tensorboard"
    extra: ClassVar[tuple[str, str] | None] = ("tensorboard", "tensorboard")

    def __init__(self, directory: Path | str, *, log_every: int = DEFAULT_LOG_EVERY) -> None:
        super().__init__(directory, log_every=log_every)
        self._writer: Any = None
        self._phase: dict[int, str] = {}

    @property
    def writer(self) -> Any:
        """The ``SummaryWriter``, opened on first use (no empty event file otherwise)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.directory))
        return self._writer

    def log_step(self, event: StepEnd, loss: float, elapsed: float) -> None:
        t, step = event.task, event.step
        if self._phase.get(t) != event.phase:
            self._phase[t] = event.phase
            self.writer.add_text(f"phase/task_{t}", event.phase, step)
        self.writer.add_scalar(f"loss/task_{t}", loss, step)
        self.writer.add_scalar(f"lr/task_{t}", event.lr, step)

    def log_epoch(self, event: EpochEnd, elapsed: float) -> None:
        self.writer.add_scalar(f"epoch_loss/task_{event.task}", event.loss, event.step)
        self.writer.flush()

    def log_task(self, record: TaskRecord) -> None:
        for tag, value in record.scalars().items():
            self.writer.add_scalar(tag, value, record.task)
        self.writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
