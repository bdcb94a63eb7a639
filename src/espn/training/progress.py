"""The progress bar: a callback like the loggers, drawing each task's optimizer steps with
tqdm (``espn run`` shows it; ``ContinualLearner(..., progress=True)`` attaches it).

It counts what the engine runs: optimizer steps, with the phase and the pass over the task's
training data in its description (``task 0 prune pass 1/2``); the size rule may make a phase
more passes than its recipe's epochs (see :func:`espn.training.engine.plan_phase`).
"""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

from espn.training.callbacks import Callback, EpochEnd, EpochStart, StepEnd, TrainStart


class ProgressBar(Callback):
    """A tqdm bar per task over its optimizer steps (hidden where the output is not a
    terminal, as tqdm does with ``disable=None``; ``disable=True`` hides it always)."""

    def __init__(self, disable: bool | None = None) -> None:
        self.disable = disable
        self.bar: Any = None

    def on_train_start(self, learner: Any, event: TrainStart) -> None:
        self.close()
        self.bar = tqdm(
            initial=event.done,
            total=event.total,
            desc=f"task {event.task}",
            unit="step",
            disable=self.disable,
            leave=False,
        )

    def on_epoch_start(self, learner: Any, event: EpochStart) -> None:
        if self.bar is not None:
            self.bar.set_description(
                f"task {event.task} {event.phase} pass {event.epoch + 1}/{event.n_epochs}"
            )

    def on_step_end(self, learner: Any, event: StepEnd) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def on_epoch_end(self, learner: Any, event: EpochEnd) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{event.loss:.3f}")

    def on_train_end(self, learner: Any, task: int) -> None:
        self.close()

    def on_run_end(self, learner: Any) -> None:
        self.close()

    def close(self) -> None:
        """Take the bar off the terminal (a task's training ended or stopped)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
