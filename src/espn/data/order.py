"""The order in which a benchmark's tasks are learned (``--task-order``: :data:`TASK_ORDERS`;
docs/cli.md describes them, ``diverse``'s descriptors included).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from espn.data.registry import task_generator
from espn.data.tasks import Task, TaskSequence, reordered

#: the orders in which a benchmark's tasks may be learned
TASK_ORDERS = ("given", "random", "large-first", "small-first", "diverse")
#: training samples per task that its diversity descriptor is computed from
DESCRIPTOR_SAMPLES = 256
#: side above which image inputs are average-pooled for the descriptor
DESCRIPTOR_SIDE = 32
#: salt of the task-order generator (distinct from the per-task subset salts)
ORDER_SALT = 2_000_003


@torch.no_grad()
def task_descriptor(task: Task) -> Tensor:
    """Mean and standard deviation of each input position of the task's model inputs."""
    split = task.train
    rows = split.index[:DESCRIPTOR_SAMPLES]
    x = task.transform(split.x[rows], False).float()
    if x.dim() == 4 and x.shape[-1] * x.shape[-2] > DESCRIPTOR_SIDE**2:
        x = F.adaptive_avg_pool2d(x, DESCRIPTOR_SIDE)
    x = x.flatten(1).cpu()
    return torch.cat([x.mean(0), x.std(0, unbiased=False)])


def farthest_point_order(descriptors: Tensor) -> list[int]:
    """Greedy farthest-point traversal: start farthest from the mean, then repeatedly the
    point whose nearest already chosen point is farthest (ties: the lowest index)."""
    n = descriptors.shape[0]
    d = descriptors.double()
    start = _first_max(torch.linalg.vector_norm(d - d.mean(0), dim=1))
    order = [start]
    nearest = torch.linalg.vector_norm(d - d[start], dim=1)
    nearest[start] = -1.0
    for _ in range(n - 1):
        nxt = _first_max(nearest)
        order.append(nxt)
        nearest = torch.minimum(nearest, torch.linalg.vector_norm(d - d[nxt], dim=1))
        nearest[order] = -1.0
    return order


def _first_max(values: Tensor) -> int:
    return int((values == values.max()).nonzero()[0])


def task_order(seq: TaskSequence, policy: str, seed: int) -> list[int]:
    """The given positions of ``seq``'s tasks in the order ``policy`` learns them."""
    n = len(seq)
    if policy == "given":
        return list(range(n))
    if policy == "random":
        return torch.randperm(n, generator=task_generator(seed, 0, ORDER_SALT)).tolist()
    if policy in ("large-first", "small-first"):
        sizes = [len(seq.tasks[t].train) for t in range(n)]
        sign = -1 if policy == "large-first" else 1
        return sorted(range(n), key=lambda t: (sign * sizes[t], t))
    if policy == "diverse":
        return farthest_point_order(torch.stack([task_descriptor(seq.tasks[t]) for t in range(n)]))
    raise ValueError(f"unknown task order {policy!r}; choose one of: {', '.join(TASK_ORDERS)}")


def ordered(seq: TaskSequence, policy: str, seed: int) -> TaskSequence:
    """``seq`` in the order ``policy`` gives (itself for ``given``)."""
    if policy == "given":
        return seq
    return reordered(seq, task_order(seq, policy, seed))
