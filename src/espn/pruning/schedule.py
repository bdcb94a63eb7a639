"""The gradual unit-pruning schedule: how far along the FLOPs target is (the new-weight
target is :func:`espn.pruning.weights.new_weight_target`)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GradualSchedule:
    """Targets at pruning progress ``p`` in [0, 1] (p = 1 at the last pruning update).

    The FLOPs target shrinks the width linearly, ``(1 - p (1 - sqrt(gamma)))^2`` of the dense
    FLOPs, ending at ``gamma``.
    """

    gamma: float

    def flops_fraction(self, progress: float) -> float:
        """FLOPs target at ``progress`` in [0, 1]: width shrinks linearly to sqrt(gamma)."""
        return (1.0 - progress * (1.0 - math.sqrt(self.gamma))) ** 2
