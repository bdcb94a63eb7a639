"""Rule ``entropy-mahalanobis``: rules (a) and (b) together, each standardised by the task's
training scores, then added: a sample must look both confidently classified and close to a
class mean of the task's features."""

from __future__ import annotations

from torch import Tensor

from espn.inference.rule import RULES, OutputRule, standardised


@RULES.register("entropy-mahalanobis")
class EntropyMahalanobis(OutputRule):
    """Standardised entropy plus standardised Mahalanobis distance."""

    name = "entropy-mahalanobis"
    summary = "standardised entropy + standardised Mahalanobis distance"
    needs_statistics = True
    uses_features = True

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return standardised(raw, calibration, 0) + standardised(raw, calibration, 2)
