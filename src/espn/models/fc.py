"""FC1024: the fully-connected supernet of the MNIST experiments (784-1024-1024-10)."""

from __future__ import annotations

import math

from torch import Tensor, nn

from espn.layers.linear import MaskedLinear, model_head
from espn.models.registry import MODELS, ModelSpec
from espn.supernet.layers import UnitGate


class FCNet(nn.Module):
    """A ReLU MLP whose hidden neurons each have a task-specific gate (the unit pruned), and
    one head per task (``multi_head``) or one shared, masked head (see docs/models.md)."""

    def __init__(
        self,
        in_features: int,
        hidden: list[int],
        n_classes: int,
        multi_head: bool,
        task_affine: bool = False,
    ):
        super().__init__()
        blocks: list[nn.Module] = []
        prev, prev_units = in_features, None
        for i, width in enumerate(hidden):
            group = f"hidden{i + 1}"
            blocks += [
                MaskedLinear(prev, width, in_units=prev_units, out_units=group),
                UnitGate(width, group, affine=task_affine),
                nn.ReLU(),
            ]
            prev, prev_units = width, group
        self.features = nn.Sequential(*blocks)
        self.head = model_head(prev, n_classes, prev_units, multi_head, task_affine)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x.flatten(1)))


@MODELS.register("fc1024")
def fc1024(spec: ModelSpec) -> FCNet:
    """784-1024-1024-10, as in SupSup and the paper's Rotated/Permuted MNIST runs."""
    return FCNet(
        math.prod(spec.input_shape), [1024, 1024], spec.n_classes, spec.multi_head, spec.task_affine
    )
