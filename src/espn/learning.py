"""The one place where a task is learned and recorded, for ``espn run`` (see
:mod:`espn.experiment`, which adds checkpoints and ``results.json`` around it) and for the
Python :class:`espn.api.ContinualLearner` alike.

A *step* is what a method trains at once (``Strategy.training_tasks``): one task for a
sequential method, every task for MTL. Learning a step commits one or more tasks; the
runner keeps one accuracy row per step and one record (FLOPs, weights, budget, time, data
sizes) per committed task, and refuses a sub-network that misses the FLOPs budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from espn.config import ConfigError
from espn.data.tasks import Task
from espn.evaluation.slim_eval import SlimEvaluator
from espn.inference import routing
from espn.methods.base import Strategy
from espn.supernet.flops import count_flops
from espn.supernet.supernet import Supernet
from espn.training.callbacks import TaskEnd
from espn.training.engine import Engine, TaskLog, TaskProgress, TrainingStopped


def task_record(supernet: Supernet, task: int) -> dict[str, Any]:
    """FLOPs and weight counts of a learned task's sub-network."""
    supernet.use_task(task)
    mask = supernet.masks[task]
    alive = supernet.alive_counts(mask.units)
    flops = supernet.flops(mask.units)
    return {
        "flops": flops,
        "flops_ratio": flops / supernet.dense_flops,
        "new_weights": mask.new_weights,
        "used_weights": supernet.used_weights(),
        "units_kept": sum(alive.values()) / max(sum(supernet.group_sizes.values()), 1),
    }


def min_flops_ratio(supernet: Supernet) -> float:
    """The smallest FLOPs ratio unit pruning can reach: one unit left in every group (the
    pruner never empties a layer, see :func:`espn.pruning.selection.select_units`; a union
    of groups, a residual stream, keeps one unit when its members keep the same one)."""
    return count_flops(supernet.costs, dict.fromkeys(supernet.widths, 1)) / max(
        supernet.dense_flops, 1
    )


def check_budget(gamma: float, record: dict[str, Any], name: str, task: int) -> None:
    """Stop when a task's sub-network misses the FLOPs budget ``gamma`` (``espn run`` then
    writes neither its results nor its checkpoint)."""
    ratio = record["flops_ratio"]
    if not ratio <= gamma * (1 + 1e-9):
        raise TrainingStopped(
            f"task {task} ({name}): its sub-network needs {ratio:.4g} of the dense FLOPs, "
            f"more than the budget gamma {gamma:g}"
        )


@dataclass
class Learned:
    """What learning one step did: the tasks it committed, its log and accuracy row."""

    tasks: range
    log: TaskLog
    row: list[float] | None


class TaskRunner:
    """Learns steps into ``supernet`` with ``strategy`` through ``engine`` and records them
    in :attr:`rows` (one per step, None where not evaluated) and :attr:`records` (one per
    task); both may start with the rows and records of tasks learned before."""

    def __init__(
        self,
        supernet: Supernet,
        strategy: Strategy,
        engine: Engine,
        rows: list[list[float] | None] | None = None,
        records: list[dict[str, Any]] | None = None,
    ) -> None:
        self.supernet, self.strategy, self.engine = supernet, strategy, engine
        self.rows: list[list[float] | None] = [] if rows is None else rows
        self.records: list[dict[str, Any]] = [] if records is None else records
        #: evaluates learned tasks through cached slim copies where the run trains slim
        self.evaluator = SlimEvaluator(supernet, enabled=engine.slim_training)

    def check_gamma_reachable(self, model: str | None) -> None:
        """Refuse, before training, a FLOPs budget gamma that no sub-network can meet."""
        gamma = self.strategy.cfg.gamma
        if not self.strategy.uses_gamma or gamma >= 1.0:
            return
        floor = min_flops_ratio(self.supernet)
        if gamma < floor:
            raise ConfigError(
                f"gamma {gamma:g} is below the smallest FLOPs ratio model "
                f"{model or 'this model'} can reach ({floor:.4g}, with one unit left in every "
                f"layer); use gamma >= {floor:.4g}"
            )

    def learn(
        self,
        step: Task,
        index: int,
        tasks: Sequence[Task | None],
        *,
        evaluate: bool = True,
        pretrained: dict[str, Tensor] | None = None,
        resume: TaskProgress | None = None,
    ) -> Learned:
        """Learn ``step`` (step number ``index``; from ``pretrained`` weights without training
        when given) and record it. ``tasks`` holds every task learned so far and the ones
        this step commits, by task index (None: its data are not known here); the row
        evaluates them all, unless ``evaluate`` is False or one has no test data."""
        first = len(self.supernet.masks)
        hooks, owner = self.engine.callbacks, self.engine.owner
        hooks.on_task_start(owner, first, step.name)
        if pretrained is not None:
            log = self.engine.adopt_task(step, pretrained)
        elif self.engine.task_agnostic:  # a tenth held out to calibrate the task's scores
            log = self.engine.train_task(routing.held_out(step)[0], index, resume=resume)
        else:
            log = self.engine.train_task(step, index, resume=resume)
        learned = range(first, len(self.supernet.masks))  # one task, or all of them for MTL
        self.store_statistics(learned, tasks)
        row = self.accuracy_row(tasks, learned.stop) if evaluate else None
        self.rows.append(row)
        new = []
        for t in learned:
            task = tasks[t]
            record = task_record(self.supernet, t) | self.strategy.report()
            record |= {
                "weight_budget": self.strategy.weight_budget,
                "seconds": log.seconds / len(learned),
                "seconds_per_epoch": log.seconds_per_epoch,
                "phases": log.phases,
                "train_samples": 0 if task is None else len(task.train),
                "test_samples": 0 if task is None else len(task.test),
                "pretrained": pretrained is not None,  # from init weights: no budget applies
            }
            if log.compiled_graphs is not None:  # --compile: graphs compiled for the task
                record["compiled_graphs"] = log.compiled_graphs
            self.records.append(record)
            new.append((record, "" if task is None else task.name, t))
        for record, name, t in new:
            if self.strategy.uses_gamma and pretrained is None:
                check_budget(self.strategy.cfg.gamma, record, name, t)
        for record, name, t in new:
            hooks.on_task_end(owner, TaskEnd(t, name, row, record))
        return Learned(learned, log, row)

    def store_statistics(self, learned: range, tasks: Sequence[Task | None]) -> None:
        """Give each task just committed the statistics of task-agnostic prediction, from
        its training data (see :mod:`espn.inference.statistics`; none without data here)."""
        for t in learned:
            task = tasks[t] if t < len(tasks) else None
            if task is not None and len(task.train):
                stats = routing.statistics(self.supernet, t, task, self.engine.task_agnostic)
                self.supernet.masks[t].stats = stats

    def accuracy_row(self, tasks: Sequence[Task | None], n: int) -> list[float] | None:
        """Accuracy (%) of tasks ``0..n-1`` on their test data (built one at a time: a lazy
        sequence stays lazy), or None when one has none here."""
        row = []
        for j in range(n):
            task = tasks[j]
            if task is None or not len(task.test):
                return None
            row.append(self.evaluator.accuracy(task, j))
        return row
