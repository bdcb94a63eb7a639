"""What every logger records (docs/logging.md), computed once from the learner's events:
:class:`MetricLogger` reads a step's loss every ``log_every`` steps and hands the steps, epochs
and learned tasks (:class:`TaskRecord`) to its subclass, which only writes them somewhere."""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from espn.errors import EspnError
from espn.settings.training import DEFAULT_LOG_EVERY, MAX_COUNT
from espn.training.callbacks import Callback, EpochEnd, StepEnd, TaskEnd


class LoggerError(EspnError, ValueError):
    """A logger asked for with a bad setting (an unknown name, a bad ``log_every``, ...)."""


class LoggerUnavailable(EspnError, RuntimeError):
    """A logger whose optional extra is not installed; the message names the extra."""


@dataclass(frozen=True)
class TaskRecord:
    """A learned task: its accuracy row (tasks ``0..task``, None: not evaluated) and the
    average of that row, its FLOPs ratio to the dense network, the weights the network uses
    after it and the weights it added, its training seconds and the seconds since the run
    started in this process."""

    task: int
    name: str
    row: list[float] | None
    average_accuracy: float | None
    flops_ratio: float | None
    used_weights: int | None
    new_weights: int | None
    seconds: float | None
    elapsed_seconds: float

    def scalars(self) -> dict[str, float]:
        """The task's figures by the tag the TensorBoard and W&B loggers give them (each
        task's accuracy in the row, then the others); those not known (None) left out."""
        tags = {
            **{f"accuracy/task_{j}": a for j, a in enumerate(self.row or [])},
            "accuracy/average": self.average_accuracy,
            "flops_ratio": self.flops_ratio,
            "weights/used": self.used_weights,
            "weights/new": self.new_weights,
            "time/task_seconds": self.seconds,
            "time/elapsed_seconds": self.elapsed_seconds,
        }
        return {tag: value for tag, value in tags.items() if value is not None}


def _cast(kind: type, value: Any) -> Any:
    """``kind(value)``, None kept (a figure a task's record does not know)."""
    return None if value is None else kind(value)


def check_log_every(log_every: object) -> int:
    """``log_every`` as an int in [1, 2^31 - 1] (``MAX_COUNT``), or a :class:`LoggerError`
    naming the bad value."""
    if (
        isinstance(log_every, bool)
        or not isinstance(log_every, int)
        or not 1 <= log_every <= MAX_COUNT
    ):
        raise LoggerError(
            f"log_every must be a whole number >= 1 and <= 2^31 - 1, got {log_every!r}"
        )
    return log_every


class MetricLogger(Callback):
    """A callback that records steps (every ``log_every``), epochs and tasks.

    Subclasses set :attr:`name` (``--log``'s name for it, its directory's too) and :attr:`extra`
    (the optional dependency it needs, or None), and write in :meth:`log_step`,
    :meth:`log_epoch`, :meth:`log_task`; :meth:`close` is called by ``on_run_end``.
    """

    #: the name ``espn run --log`` and :func:`espn.training.loggers.make_loggers` accept, and
    #: of the directory it writes in, in the run directory's ``logs``
    name: ClassVar[str]
    #: (module, pip extra) the logger needs beyond espn's own dependencies, or None
    extra: ClassVar[tuple[str, str] | None] = None

    def __init__(self, directory: Path | str, *, log_every: int = DEFAULT_LOG_EVERY) -> None:
        self.directory = Path(directory)
        self.log_every = check_log_every(log_every)
        self.check_available()
        self._start: float | None = None

    @classmethod
    def check_available(cls) -> None:
        """Raise :class:`LoggerUnavailable` when the logger's optional extra is missing."""
        if cls.extra is not None and importlib.util.find_spec(cls.extra[0]) is None:
            raise LoggerUnavailable(
                f"the {cls.name} logger needs the {cls.extra[0]!r} package, which is not "
                f"installed; install it with: pip install 'espn[{cls.extra[1]}]'"
            )

    @classmethod
    def in_run(cls, run_dir: Path, *, log_every: int = DEFAULT_LOG_EVERY) -> MetricLogger:
        """The logger writing into its place in the run directory ``run_dir``."""
        return cls(Path(run_dir) / "logs" / cls.name, log_every=log_every)

    def elapsed(self) -> float:
        """Seconds since the run started in this process (its first event)."""
        now = time.perf_counter()
        if self._start is None:
            self._start = now
        return now - self._start

    def on_run_start(self, learner: Any) -> None:
        self.elapsed()

    def on_step_end(self, learner: Any, event: StepEnd) -> None:
        if event.step % self.log_every:
            return
        loss = float(event.loss)  # the only host-device synchronisation, every log_every steps
        self.log_step(event, loss, self.elapsed())

    def on_epoch_end(self, learner: Any, event: EpochEnd) -> None:
        self.log_epoch(event, self.elapsed())

    def on_task_end(self, learner: Any, event: TaskEnd) -> None:
        row = None if event.row is None else [float(a) for a in event.row]
        self.log_task(
            TaskRecord(
                task=event.task,
                name=event.name,
                row=row,
                average_accuracy=sum(row) / len(row) if row else None,
                flops_ratio=_cast(float, event.record.get("flops_ratio")),
                used_weights=_cast(int, event.record.get("used_weights")),
                new_weights=_cast(int, event.record.get("new_weights")),
                seconds=_cast(float, event.record.get("seconds")),
                elapsed_seconds=self.elapsed(),
            )
        )

    def on_run_end(self, learner: Any) -> None:
        self.close()

    def log_step(self, event: StepEnd, loss: float, elapsed: float) -> None:
        """Write one logged step: its ``loss`` (read from the device) and the seconds
        ``elapsed`` since the run started in this process."""

    def log_epoch(self, event: EpochEnd, elapsed: float) -> None:
        """Write one pass over a task's training data (``elapsed`` as for a step)."""

    def log_task(self, record: TaskRecord) -> None:
        """Write one learned task."""

    def close(self) -> None:
        """Write what is buffered and release files (the run is over)."""
