"""Accuracy of task sub-networks and the continual-learning summaries of an accuracy matrix."""

from __future__ import annotations

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


@torch.no_grad()
def task_accuracy(
    supernet: Supernet, task: Task, task_id: int, split: str = "test", batch_size: int = 1024
) -> float:
    """Top-1 accuracy in percent of task ``task_id``'s sub-network on ``split``."""
    supernet.eval()
    correct = torch.zeros((), dtype=torch.long, device=task.split(split).y.device)
    for x, y in task.batches(split, batch_size):
        correct += (supernet(x, task=task_id).argmax(1) == y).sum()
    return 100.0 * int(correct) / max(len(task.split(split)), 1)


def final_accuracy(matrix: list[list[float]]) -> list[float]:
    """Accuracy of every task after the last task was learned (the last row)."""
    return list(matrix[-1])


def average_accuracy(matrix: list[list[float]]) -> float:
    """Mean accuracy over all tasks after the last one (the matrix's last row)."""
    row = matrix[-1]
    return sum(row) / len(row)


def forgetting(matrix: list[list[float]]) -> list[float]:
    """Per task: best accuracy it ever had minus its final accuracy (0 for zero forgetting).

    Rows may cover several tasks at once (MTL's single row covers all of them)."""
    last = matrix[-1]
    return [max(row[j] for row in matrix if len(row) > j) - last[j] for j in range(len(last))]


def backward_transfer(matrix: list[list[float]]) -> float:
    """BWT (Lopez-Paz & Ranzato 2017): mean over j < T-1 of acc[T-1][j] - acc[j][j]."""
    n = len(matrix)
    if n < 2:
        return 0.0
    return sum(matrix[-1][j] - matrix[j][j] for j in range(n - 1)) / (n - 1)
