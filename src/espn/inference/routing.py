"""Training that prepares a task for prediction without the task id (``task_agnostic``).

With the option on (``ContinualLearner(..., task_agnostic=True)``, ``espn run
--task-agnostic``), every method that keeps one sub-network per task learns each task so that
its sub-network can tell its own inputs from others', exemplar-free (no other task's data):

* *outlier exposure from the task's own data*: every training batch is also passed through
  the sub-network shifted (:func:`not_mine`: the input rolled by half its length along every
  spatial axis, so the task's own patterns appear in the wrong places), and the sub-network
  is trained to be uncertain there (cross-entropy to the uniform distribution over its
  classes, weight :data:`WEIGHT`). The shift is a roll, not a rotation: in rotated sequences
  a rotation of a task's inputs is another task's input, which the task must not reject as
  "not a digit" but cannot tell from its own either;
* *scores calibrated on held-out data*: every :data:`HELD_OUT_EVERY`-th training sample of
  the task is held out of training; the mean and deviation of each raw score (the task's
  ``calibration``) come from those samples, which the sub-network has not fitted, so that a
  task's typical score is the one its unseen inputs get, as at prediction.

Neither changes what a sub-network is: no output, weight or unit is added, so the task's
FLOPs, storage and FLOP budget are those of the option off; the shifted pass costs one more
forward and backward pass per training step.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from espn.data.tasks import Split, Task

#: weight of the outlier-exposure term in the training loss
WEIGHT = 0.5
#: every this-many-th training sample of a task is held out for its calibration
HELD_OUT_EVERY = 10


def not_mine(x: Tensor) -> Tensor:
    """``x`` (N, C, *spatial) rolled by half its size along every spatial axis (an image's
    quadrants swapped diagonally, a signal's halves swapped); a batch of flat vectors (N, D)
    or tokens is rolled along its one axis."""
    dims = tuple(range(2, x.dim())) if x.dim() > 2 else (1,)
    return torch.roll(x, shifts=tuple(x.shape[d] // 2 for d in dims), dims=dims)


def rejection_loss(logits: Tensor) -> Tensor:
    """Cross-entropy of ``logits`` to the uniform distribution over their classes: lowest
    when the sub-network cannot tell which of its classes the input is."""
    return -F.log_softmax(logits.float(), dim=1).mean()


def held_out(task: Task) -> tuple[Task, Task]:
    """``task`` without every :data:`HELD_OUT_EVERY`-th training sample, and those samples
    alone (as its training split; deterministic, so a resumed run holds out the same)."""
    split = task.train
    rows = torch.arange(len(split), device=split.index.device)
    out = rows % HELD_OUT_EVERY == HELD_OUT_EVERY - 1

    def part(keep: Tensor) -> Task:
        return dataclasses.replace(task, train=Split(split.x, split.index[keep], split.y[keep]))

    return part(~out), part(out)
