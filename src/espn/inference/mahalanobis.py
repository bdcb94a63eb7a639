"""Rule ``mahalanobis``: the task whose penultimate features lie closest to one of its class
means (diagonal Mahalanobis distance), standardised by the task's training distances."""

from __future__ import annotations

from torch import Tensor

from espn.inference.rule import RULES, OutputRule, standardised


@RULES.register("mahalanobis")
class Mahalanobis(OutputRule):
    """The lowest standardised distance to a class mean of the task's own features."""

    name = "mahalanobis"
    summary = (
        "nearest class mean of the sub-network's penultimate features (diagonal Mahalanobis "
        "distance), standardised by the task's training distances"
    )
    needs_statistics = True
    uses_features = True

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return standardised(raw, calibration, 2)
