"""A task's batch transform: raw batch (and whether it trains) to model input, applied on the
device, vectorised; :func:`identity` for samples that are model inputs already."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

BatchTransform = Callable[[Tensor, bool], Tensor]


def identity(x: Tensor, train: bool) -> Tensor:
    """The transform of a task whose samples are model inputs already."""
    return x
