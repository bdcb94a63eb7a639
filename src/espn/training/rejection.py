"""The training term that teaches a task what is not its own (``task_agnostic``): each
training batch is also passed through the sub-network shifted (:func:`not_mine`) and the
sub-network is trained to be uncertain there (:func:`rejection_loss`, weight :data:`WEIGHT`);
why this shift and what the option stores besides: :mod:`espn.inference.routing`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

#: weight of the outlier-exposure term in the training loss
WEIGHT = 0.5


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
