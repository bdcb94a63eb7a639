"""Accuracy and cost (FLOPs, weights) of task sub-networks and the continual-learning
summaries of an accuracy matrix."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from espn.data.tasks import Task
from espn.supernet.supernet import Supernet


@torch.no_grad()
def task_logits(
    supernet: Supernet, task: Task, task_id: int, split: str = "test", batch_size: int = 1024
) -> Tensor:
    """Logits of task ``task_id``'s sub-network on every sample of ``split``, in order."""
    supernet.eval()
    return torch.cat([supernet(x, task=task_id) for x, _ in task.batches(split, batch_size)])


class Shares(Protocol):
    """What evaluation needs of data-parallel ranks (:class:`espn.training.distributed.Ranks`):
    which batches are this rank's, and a sum over the ranks."""

    def mine(self, k: int) -> bool: ...

    def sum_(self, t: Tensor) -> Tensor: ...


@torch.no_grad()
def split_accuracy(
    logits: Callable[[Tensor], Tensor],
    task: Task,
    split: str,
    batch_size: int,
    ranks: Shares | None = None,
) -> float:
    """Top-1 accuracy in percent of ``logits`` on ``split`` of ``task`` (with ``ranks``, each
    counts its share of the batches and the counts are summed)."""
    correct = torch.zeros((), dtype=torch.long, device=task.split(split).y.device)
    for k, (x, y) in enumerate(task.batches(split, batch_size)):
        if ranks is None or ranks.mine(k):
            correct += (logits(x).argmax(1) == y).sum()
    if ranks is not None:
        ranks.sum_(correct)
    return 100.0 * int(correct) / max(len(task.split(split)), 1)


@torch.no_grad()
def task_accuracy(
    supernet: Supernet, task: Task, task_id: int, split: str = "test", batch_size: int = 1024
) -> float:
    """Top-1 accuracy in percent of task ``task_id``'s sub-network on ``split``."""
    supernet.eval()
    return split_accuracy(lambda x: supernet(x, task=task_id), task, split, batch_size)


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


#: an accuracy matrix: one row per training step, None where evaluation was skipped
#: (``--eval-every``); the last step's row is always there in a finished run
Matrix = Sequence[Sequence[float] | None]


def last_row(matrix: Matrix) -> tuple[int, list[float]]:
    """Index and values of the latest evaluated row."""
    for i in range(len(matrix) - 1, -1, -1):
        row = matrix[i]
        if row is not None:
            return i, list(row)
    raise ValueError("the accuracy matrix has no evaluated row")


def final_accuracy(matrix: Matrix) -> list[float]:
    """Accuracy of every task after the last task was learned (the last evaluated row)."""
    return last_row(matrix)[1]


def average_accuracy(matrix: Matrix) -> float:
    """Mean accuracy over all tasks after the last one (the last evaluated row)."""
    row = final_accuracy(matrix)
    return sum(row) / len(row)


def forgetting(matrix: Matrix) -> list[float]:
    """Per task: best accuracy it had in an evaluated row minus its final accuracy (0 for
    zero forgetting).

    Rows may cover several tasks at once (MTL's single row covers all of them)."""
    last = final_accuracy(matrix)
    rows = [row for row in matrix if row is not None]
    return [max(row[j] for row in rows if len(row) > j) - last[j] for j in range(len(last))]


def backward_transfer(matrix: Matrix) -> float:
    """BWT (Lopez-Paz & Ranzato 2017): mean over j < T-1 of acc[T-1][j] - acc[j][j], over the
    tasks j whose row was evaluated (all of them unless ``--eval-every`` skipped some)."""
    n, last = last_row(matrix)
    diagonal = {j: row[j] for j, row in enumerate(matrix[:n]) if row is not None}
    if not diagonal:
        return 0.0
    return sum(last[j] - acc for j, acc in diagonal.items()) / len(diagonal)
