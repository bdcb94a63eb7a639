"""Rule ``energy``: the task whose logits have the lowest energy ``-logsumexp`` (Liu et al.
2020's out-of-distribution score), standardised by the task's training energies."""

from __future__ import annotations

from torch import Tensor

from espn.inference.rule import RULES, OutputRule, standardised


@RULES.register("energy")
class Energy(OutputRule):
    """The lowest standardised energy: ``(E(x) - mean_t) / std_t`` with ``E = -logsumexp``."""

    name = "energy"
    summary = "lowest energy -logsumexp(logits), standardised by the task's training energies"
    needs_statistics = True

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return standardised(raw, calibration, 1)
