"""Gradual pruning schedules: how far along the FLOPs and new-weight targets are."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GradualSchedule:
    """Targets at pruning progress ``p`` in [0, 1] (p = 1 at the last pruning update).

    The FLOPs target shrinks the width linearly, ``(1 - p (1 - sqrt(gamma)))^2`` of the dense
    FLOPs, ending at ``gamma``; the new-weight target falls linearly from the new weights
    available when pruning starts to the task's budget.
    """

    gamma: float

    def flops_fraction(self, progress: float) -> float:
        """FLOPs target at ``progress`` in [0, 1]: width shrinks linearly to sqrt(gamma)."""
        return (1.0 - progress * (1.0 - math.sqrt(self.gamma))) ** 2

    @staticmethod
    def new_weight_target(progress: float, start: int, budget: int) -> int:
        """New weights allowed at ``progress``: from ``start`` down to ``budget`` linearly."""
        if start <= budget:
            return start
        return budget + math.floor((1.0 - progress) * (start - budget))
