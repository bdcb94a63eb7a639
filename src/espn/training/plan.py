"""A task's plan and its record: the size rule that sets each phase's steps
(:func:`plan_phase`), where a phase's prune events fall (:func:`prune_points`), where
training stands between two epochs (:class:`TaskProgress`, what a checkpoint resumes) and
what a trained task reports (:class:`TaskLog`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from espn.methods.base import Phase
from espn.training.callbacks import PhasePlan


@dataclass
class TaskLog:
    """What happened while training one task."""

    seconds: float
    epochs: int
    seconds_per_epoch: float
    #: per phase, what ran (:meth:`~espn.training.callbacks.PhasePlan.record`)
    phases: list[dict[str, Any]] = field(default_factory=list)
    #: graphs the compiled step compiled during the task (None: the step ran eagerly)
    compiled_graphs: int | None = None


@dataclass
class TaskProgress:
    """Where training of a task stands between two epochs: enough to continue it exactly.

    The next epoch to run is ``epoch`` of phase ``phase`` (``epoch == 0``: the phase has not
    started); ``step`` and ``prunes_done`` are that phase's optimizer steps and prune steps so
    far. ``optimizer`` is the optimizer's ``state_dict()["state"]``; ``phases_run`` records
    the phases before ``phase`` (see :attr:`TaskLog.phases`); ``seconds`` is the task's
    training time so far, so that a resumed task reports its whole time; ``slim_steps`` the
    steps of phase ``phase`` so far that trained a slim copy.
    """

    phase: int = 0
    epoch: int = 0
    step: int = 0
    prunes_done: int = 0
    epochs_done: int = 0
    loss: float = float("nan")
    optimizer: dict[int, dict[str, Any]] | None = None
    phases_run: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    slim_steps: int = 0


def reference_batches(reference_size: int | None, batch_size: int) -> int | None:
    """Optimizer steps of one epoch over ``reference_size`` images (None: no size rule)."""
    return None if reference_size is None else math.ceil(reference_size / batch_size)


def plan_phase(phase: Phase, batches_per_epoch: int, per_reference_epoch: int | None) -> PhasePlan:
    """The size rule (docs/recipes.md): a phase of E epochs runs at least E x
    ``per_reference_epoch`` optimizer steps, its last pass cut at the step count; a larger
    task trains its E epochs as given. ``per_reference_epoch`` None: epochs as given."""
    steps = phase.epochs * batches_per_epoch
    floor = 0 if per_reference_epoch is None else phase.epochs * per_reference_epoch
    if floor <= steps:
        return PhasePlan(phase.name, phase.epochs, phase.epochs, steps)
    return PhasePlan(phase.name, phase.epochs, math.ceil(floor / batches_per_epoch), floor)


def prune_points(n_iters: int, n_updates: int) -> list[int]:
    """Iterations (1-based, after which) the ``n_updates`` prune steps of a phase happen."""
    if n_updates <= 0:
        return []
    return [max(0, (k * n_iters) // n_updates) for k in range(1, n_updates + 1)]
