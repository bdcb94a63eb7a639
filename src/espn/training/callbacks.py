"""Callbacks: what the learner tells the world while it learns (loggers, the progress bar, the
run directory); the hooks and their events: docs/logging.md, "Your own callback".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from torch import Tensor


@dataclass(frozen=True)
class PhasePlan:
    """How long a phase of one task runs: ``steps`` optimizer steps in ``epochs`` passes over
    the task's training data, the last pass cut short where ``steps`` is not a whole number
    of passes (see :func:`plan_phase`)."""

    name: str
    recipe_epochs: int
    epochs: int
    steps: int

    def record(self, ran: bool = True, slim_steps: int = 0) -> dict[str, Any]:
        """The phase's entry of :attr:`TaskLog.phases` (zeros for a phase left out), with
        the ``slim_steps`` of its steps that trained a slim copy."""
        return {
            "phase": self.name,
            "recipe_epochs": self.recipe_epochs,
            "epochs": self.epochs if ran else 0,
            "steps": self.steps if ran else 0,
            "slim_steps": slim_steps,
        }


@dataclass(frozen=True)
class TrainStart:
    """Before a task's optimizer steps: ``total`` steps in all its phases (as the size rule
    counts them), ``done`` of them already run (a task resumed mid-way); ``phases``: each
    phase's :class:`PhasePlan`, ``samples``: the task's training samples."""

    task: int
    name: str
    total: int
    done: int
    phases: tuple[PhasePlan, ...] = ()
    samples: int = 0


@dataclass(frozen=True)
class EpochStart:
    """Before pass ``epoch`` (from 0) of ``n_epochs`` over a task's training data in
    ``phase``."""

    task: int
    phase: str
    epoch: int
    n_epochs: int


@dataclass(frozen=True)
class StepEnd:
    """After one optimizer step: ``step`` counts the task's steps so far (from 1)."""

    task: int
    phase: str
    step: int
    loss: Tensor
    lr: float


@dataclass(frozen=True)
class EpochEnd:
    """After one pass over a task's training data (``epoch`` from 0 of ``n_epochs`` in
    ``phase``), with the task's optimizer steps and training seconds so far. Its
    :attr:`position` (what the run directory checkpoints) is made by ``locate`` when first
    read."""

    task: int
    phase: str
    epoch: int
    n_epochs: int
    step: int
    loss: float
    seconds: float
    locate: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def position(self) -> Any:
        """Where the task stands now, enough to continue it exactly (a
        :class:`~espn.training.plan.TaskProgress` with the optimizer's state; None: not
        known). Reading it first brings the supernet up to date with a slim copy that trains
        the task (see :mod:`espn.training.slim_step`): until then, inside a phase, the
        supernet holds the copy's training as of the last checkpoint or prune event."""
        return None if self.locate is None else self.locate()


@dataclass(frozen=True)
class TaskEnd:
    """After a task is committed: its accuracy row (tasks ``0..task``; None: not evaluated)
    and its record (``flops_ratio``, ``used_weights``, ``new_weights``, ``seconds``, ...)."""

    task: int
    name: str
    row: list[float] | None
    record: dict[str, Any] = field(default_factory=dict)


class Callback:
    """Hooks called by the learner; each does nothing unless overridden."""

    def on_run_start(self, learner: Any) -> None:
        """Before the first task a learner learns in this process."""

    def on_task_start(self, learner: Any, task: int, name: str) -> None:
        """Before task ``task`` is trained (also when it resumes mid-way)."""

    def on_train_start(self, learner: Any, event: TrainStart) -> None:
        """Before a task's first optimizer step (also when it resumes mid-way)."""

    def on_epoch_start(self, learner: Any, event: EpochStart) -> None:
        """Before every pass over the task's training data."""

    def on_step_end(self, learner: Any, event: StepEnd) -> None:
        """After every optimizer step."""

    def on_epoch_end(self, learner: Any, event: EpochEnd) -> None:
        """After every pass over the task's training data."""

    def on_train_end(self, learner: Any, task: int) -> None:
        """After a task's last optimizer step, or when its training stopped."""

    def on_task_end(self, learner: Any, event: TaskEnd) -> None:
        """After a task is committed and evaluated."""

    def on_run_end(self, learner: Any) -> None:
        """When the learner is done (``close()``, or the end of ``espn run``)."""


class CallbackList(Callback):
    """Several callbacks called in order, as one: each hook calls theirs."""

    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self.callbacks = list(callbacks)

    def append(self, callback: Callback) -> None:
        """Call ``callback`` after those already here."""
        self.callbacks.append(callback)


def _each(hook: str) -> Callable[..., None]:
    def call(self: CallbackList, *args: Any) -> None:
        for c in self.callbacks:
            getattr(c, hook)(*args)

    call.__name__ = call.__qualname__ = hook
    return call


for _hook in [name for name in vars(Callback) if name.startswith("on_")]:
    setattr(CallbackList, _hook, _each(_hook))
