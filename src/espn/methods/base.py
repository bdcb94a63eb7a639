"""The strategy interface: what a continual-learning method adds to the training engine."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from espn.pruning.schedule import GradualSchedule
from espn.pruning.selection import select_weights
from espn.registry import Registry
from espn.supernet.supernet import Supernet


@dataclass(frozen=True)
class Phase:
    """A stretch of training of one task.

    ``prune_updates`` prune steps are spread evenly over the phase, the last one at its end
    (all at once when the phase has no epochs); ``cosine`` decays the learning rate to zero
    over the phase; ``regularise`` adds the strategy's penalty to the loss.
    """

    name: str
    epochs: int
    cosine: bool = False
    regularise: bool = False
    prune_updates: int = 0


@dataclass(frozen=True)
class MethodConfig:
    """Settings of a method; each method reads the ones that concern it."""

    gamma: float = 1.0
    alpha: float = 0.05
    epochs: tuple[int, int, int] = (3, 4, 3)
    pruner: str = "flop-aware"
    penalty: float = 1e-4
    reuse: str = "magnitude"
    prune_updates_per_epoch: int = 4


class Strategy(ABC):
    """A continual-learning method as hooks over the one training engine."""

    name: ClassVar[str]
    #: whether the unit gates / BatchNorm affine parameters are trained (heads always are)
    train_unit_affine: ClassVar[bool] = True
    #: whether the method takes a FLOPs budget gamma
    uses_gamma: ClassVar[bool] = True

    def __init__(self, cfg: MethodConfig) -> None:
        self.cfg = cfg
        self.layer_budgets: dict[str, int] = {}
        self.layer_free: dict[str, int] = {}
        self.weight_budget = 0

    @abstractmethod
    def phases(self) -> list[Phase]:
        """The phases every task goes through, in order."""

    def begin_task(self, supernet: Supernet) -> None:
        """Called after the supernet opened a new working sub-network."""
        self.weight_budget = supernet.weight_budget(self.cfg.alpha)
        self.layer_free = {n: int((~m.frozen).sum()) for n, m in supernet.layers.items()}
        self.layer_budgets = {n: math.floor(self.cfg.alpha * f) for n, f in self.layer_free.items()}

    def penalty(self, supernet: Supernet) -> Tensor | None:
        """A regulariser added to the loss in phases with ``regularise=True``."""
        return None

    def prune_step(self, supernet: Supernet, progress: float) -> None:
        """Shrink the working sub-network; ``progress`` reaches 1.0 at the last step."""

    def prune_weights(self, supernet: Supernet, progress: float, reuse: str) -> None:
        """Magnitude-prune every layer towards its new-weight budget at ``progress``.

        A layer's budget is ``floor(alpha * its free weights)``, so that the task's new
        weights never exceed ``ceil(alpha * all free weights)``.
        """
        masks = {}
        for name, layer in supernet.layers.items():
            n_new = GradualSchedule.new_weight_target(
                progress, self.layer_free[name], self.layer_budgets[name]
            )
            candidates = layer.weight_mask.bool()
            masks[name] = select_weights(layer.weight, candidates, layer.frozen, n_new, reuse)
        supernet.set_weight_masks(masks)


METHODS: Registry[type[Strategy]] = Registry("method")
