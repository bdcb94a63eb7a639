"""Rule ``energy``: the task whose logits' energy ``-logsumexp`` (Liu et al. 2020's
out-of-distribution score) is most typical of its own data: the smallest distance to the
task's mean energy, in the task's deviations."""

from __future__ import annotations

from torch import Tensor

from espn.inference.rule import RULES, OutputRule, atypical


@RULES.register("energy")
class Energy(OutputRule):
    """The most typical energy: the lowest ``|E(x) - mean_t| / std_t`` with ``E = -logsumexp``."""

    name = "energy"
    summary = "energy -logsumexp(logits) closest to the task's own, in its deviations"
    needs_statistics = True

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return atypical(raw, calibration, 1)
