"""Following each task's training (``espn run`` shows it; ``ContinualLearner(...,
progress=True)`` attaches it): its start, its estimated time and its end, and between them a
tqdm bar on a terminal or a plain line every 30 seconds elsewhere (docs/logging.md).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from tqdm.auto import tqdm

from espn.training.callbacks import Callback, EpochEnd, EpochStart, StepEnd, TrainStart
from espn.utils.text import printable

#: the time of a task is estimated after this many of its steps, or this many seconds
ESTIMATE_STEPS = 10
ESTIMATE_SECONDS = 5.0
#: seconds between two plain lines where the output is not a terminal
EVERY_SECONDS = 30.0


def duration(seconds: float) -> str:
    """``seconds`` for a person: ``42 s``, ``6.1 min``, ``2.3 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def start_line(event: TrainStart) -> str:
    """What a task's training will be: its steps per phase, its passes over its data, and
    where the size rule made them more than the recipe's epochs."""
    name = "" if event.name == f"task {event.task}" else f" ({printable(event.name)})"
    passes = sum(p.epochs for p in event.phases)
    recipe = sum(p.recipe_epochs for p in event.phases)
    per_phase = ", ".join(f"{p.name} {p.steps}" for p in event.phases)
    line = f"task {event.task}{name}: {event.total} optimizer steps ({per_phase})"
    if event.samples:
        line += f", {passes} passes over its {event.samples} training samples"
    if passes > recipe:
        line += f" (the size rule: the recipe's {recipe} epochs are stated for more data)"
    if event.done:
        line += f"; continues after step {event.done}"
    return line


@dataclass
class _Training:
    """The task in training: its start event, where it is, and when lines were written."""

    event: TrainStart
    started: float
    done: int
    where: str = ""
    loss: float | None = None
    estimated: bool = False
    written: float = 0.0

    def steps(self) -> int:
        """Steps run in this process."""
        return self.done - self.event.done

    def left(self, now: float) -> float:
        """Seconds the remaining steps take at this process's rate so far."""
        return (now - self.started) / max(self.steps(), 1) * (self.event.total - self.done)


class ProgressBar(Callback):
    """Each task's training followed (see the module docstring). ``disable``: None (default)
    chooses by the output, False draws the bar always, True shows nothing; ``every``: seconds
    between two plain lines; ``file``: where (default: the standard error when written)."""

    def __init__(
        self, disable: bool | None = None, every: float = EVERY_SECONDS, file: TextIO | None = None
    ) -> None:
        self.disable, self.every, self.file = disable, every, file
        self.bar: Any = None
        self.training: _Training | None = None

    def _out(self) -> TextIO:
        return sys.stderr if self.file is None else self.file

    def terminal(self) -> bool:
        """Whether the output is a terminal (where the bar is drawn)."""
        return bool(getattr(self._out(), "isatty", lambda: False)())

    def say(self, line: str) -> None:
        """Write one line (above the bar where one is drawn)."""
        if self.bar is not None:
            self.bar.write(line, file=self._out())
        else:
            print(line, file=self._out(), flush=True)

    def on_train_start(self, learner: Any, event: TrainStart) -> None:
        self.close()
        if self.disable is True:
            return
        now = time.perf_counter()
        self.training = _Training(event, now, event.done, written=now)
        self.say(start_line(event))
        if self.disable is False or self.terminal():
            self.bar = tqdm(
                initial=event.done,
                total=event.total,
                desc=f"task {event.task}",
                unit="step",
                file=self._out(),
                leave=False,
            )

    def on_epoch_start(self, learner: Any, event: EpochStart) -> None:
        if self.training is None:
            return
        self.training.where = f"{event.phase} pass {event.epoch + 1}/{event.n_epochs}"
        if self.bar is not None:
            self.bar.set_description(f"task {event.task} {self.training.where}")

    def on_step_end(self, learner: Any, event: StepEnd) -> None:
        t = self.training
        if t is None:
            return
        t.done = event.step
        if self.bar is not None:
            self.bar.update(1)
        now = time.perf_counter()
        if t.done >= t.event.total:
            return
        if not t.estimated:
            if t.steps() >= ESTIMATE_STEPS or now - t.started >= ESTIMATE_SECONDS:
                t.estimated, t.written = True, now
                self.say(
                    f"task {t.event.task}: {t.steps()} step{'s' * (t.steps() != 1)} took "
                    f"{duration(now - t.started)}; "
                    f"about {duration(t.left(now))} to go"
                )
        elif self.bar is None and now - t.written >= self.every:
            t.written = now
            loss = "" if t.loss is None else f", loss {t.loss:.4g}"
            self.say(
                f"task {t.event.task}: step {t.done}/{t.event.total} "
                f"({100 * t.done // t.event.total}%), {t.where}{loss}; "
                f"about {duration(t.left(now))} to go"
            )

    def on_epoch_end(self, learner: Any, event: EpochEnd) -> None:
        if self.training is not None:
            self.training.loss = event.loss
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{event.loss:.3f}")

    def on_train_end(self, learner: Any, task: int) -> None:
        t = self.training
        if t is not None:
            took = duration(time.perf_counter() - t.started)
            self.say(f"task {task}: training ended, {t.steps()} steps in {took}")
        self.close()

    def on_run_end(self, learner: Any) -> None:
        self.close()

    def close(self) -> None:
        """Take the bar off the terminal (a task's training ended or stopped)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.training = None
