"""Rule ``entropy-mahalanobis``: the entropy's distance to the task's typical entropy plus the
standardised Mahalanobis distance (both in the task's deviations): a sample must be
classified as the task's own data are and lie close to a class mean of the task's features."""

from __future__ import annotations

from torch import Tensor

from espn.inference.rule import RULES, OutputRule, atypical, standardised


@RULES.register("entropy-mahalanobis")
class EntropyMahalanobis(OutputRule):
    """Atypical entropy plus standardised Mahalanobis distance."""

    name = "entropy-mahalanobis"
    summary = "|standardised entropy| + standardised Mahalanobis distance"
    needs_statistics = True
    uses_features = True

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return atypical(raw, calibration, 0) + standardised(raw, calibration, 2)
