"""Individual-gamma: every task trains its own network from scratch, pruned to gamma."""

from __future__ import annotations

from typing import ClassVar

import torch

from espn.methods.base import METHODS, Recipes
from espn.methods.espn import ESPN
from espn.settings.methods import METHOD_OPTIONS
from espn.settings.training import TrainingSettings
from espn.supernet.supernet import Supernet


@METHODS.register("individual")
class Individual(ESPN):
    """One network per task, each trained from the supernet's initial weights with ESPN's
    phases and unit pruning to gamma, kept as its own copy (``weights = "own"``): nothing is
    shared or frozen; ``alpha`` < 1 adds a weight budget per task (docs/methods.md)."""

    weights = "own"
    # no free_init: every task starts from the initial weights
    options = METHOD_OPTIONS["individual"]
    #: no weight budget unless alpha is given
    recipe: ClassVar[Recipes] = {regime: {"alpha": 1.0} for regime in ("mnist", "cifar")}

    def __init__(self, cfg: TrainingSettings) -> None:
        super().__init__(cfg)
        self.initial: dict[str, torch.Tensor] = {}

    def attach(self, supernet: Supernet) -> None:
        """Remember the freshly initialised weights every task starts from."""
        self.initial = {n: m.weight.detach().clone() for n, m in supernet.layers.items()}

    @torch.no_grad()
    def begin_task(self, supernet: Supernet) -> None:
        if not self.initial:
            raise RuntimeError("Individual.attach(supernet) must run before the first task")
        for name, layer in supernet.layers.items():
            layer.weight.copy_(self.initial[name])
            layer.frozen.zero_()
        super().begin_task(supernet)

    def prune_weights(self, supernet: Supernet, progress: float, reuse: str) -> None:
        """ESPN's weight pruning only under a weight budget (alpha < 1); nothing is frozen."""
        if self.cfg.alpha < 1.0:
            super().prune_weights(supernet, progress, "all")
