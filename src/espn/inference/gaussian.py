"""Rule ``input-gaussian``: the task under whose input statistics the sample is most likely.

Each task stores, when it is committed, a diagonal Gaussian per class of its own inputs
(class means and a pooled variance, see :mod:`espn.inference.statistics`); a sample goes to
the task whose equal mixture of class Gaussians gives it the highest likelihood (Bayes with
equal task priors). No sub-network runs to infer the task, only the chosen one to classify:
rotated and permuted tasks differ most in their inputs, which this reads directly.
"""

from __future__ import annotations

from torch import Tensor

from espn.inference.rule import RULES, OutputRule


@RULES.register("input-gaussian")
class InputGaussian(OutputRule):
    """The highest likelihood of the input under the task's class Gaussians."""

    name = "input-gaussian"
    summary = (
        "highest likelihood of the input under the task's stored per-class diagonal Gaussians "
        "of its inputs; only the chosen sub-network runs"
    )
    needs_statistics = True
    uses_outputs = False
    uses_input = True

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return raw[..., 3]
