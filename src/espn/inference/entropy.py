"""Rule ``entropy``: the task whose sub-network is most confident (lowest softmax entropy)."""

from __future__ import annotations

from torch import Tensor

from espn.inference.rule import RULES, OutputRule


@RULES.register("entropy")
class Entropy(OutputRule):
    """The lowest softmax entropy over the tasks' sub-networks; stores nothing per task."""

    name = "entropy"
    summary = "lowest softmax entropy over the tasks' sub-networks (stores nothing)"

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return raw[..., 0]
