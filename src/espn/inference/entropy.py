"""Rule ``entropy``: the task whose sub-network is most confident (lowest softmax entropy,
relative to its head's largest entropy ``log C`` so that heads of different sizes compare)."""

from __future__ import annotations

from torch import Tensor

from espn.inference.rule import RULES, OutputRule


@RULES.register("entropy")
class Entropy(OutputRule):
    """The lowest relative softmax entropy over the tasks' sub-networks; stores nothing."""

    name = "entropy"
    summary = "lowest softmax entropy / log C over the tasks' sub-networks (stores nothing)"

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return raw[..., 0]
