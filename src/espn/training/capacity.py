"""When training must stop rather than break a guarantee: :class:`TrainingStopped`, the check
that a task of a weight-sharing method still gets new weights, and the FLOPs budget check."""

from __future__ import annotations

from typing import Any

from espn.errors import EspnError
from espn.methods.base import Strategy


class TrainingStopped(EspnError, RuntimeError):
    """Training cannot go on without breaking a guarantee (a non-finite loss, no weights
    left for a task, a budget not met); the message names the task, phase and epoch."""


def check_capacity(strategy: Strategy, name: str, index: int) -> None:
    """Stop before a task of a weight-sharing method that would get no new weight at all:
    every method whose tasks own the weights they train (``weights == "shared"``) stops when
    the earlier tasks took every weight, an ``alpha`` method also when its allocation rounds
    down to none in every layer. Such a task would be trained at chance."""
    if strategy.weights != "shared":
        return
    free = sum(strategy.layer_free.values())
    if free > 0 and (
        not strategy.uses_alpha
        or (strategy.weight_budget > 0 and sum(strategy.layer_budgets.values()) > 0)
    ):
        return
    if free == 0:
        why = "the earlier tasks took every weight"
        fix = strategy.capacity_hint()
    else:
        why = (
            f"{free} weight(s) are free, but alpha {strategy.cfg.alpha:g} of each layer's rounds "
            "down to none"
        )
        fix = "use a larger --alpha (alpha=) or a wider model"
    raise TrainingStopped(
        f"task {index} ({name}) would get no new weights: {why}; the network's capacity "
        f"is used up, so the run stops before it with the earlier tasks kept ({fix})"
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
