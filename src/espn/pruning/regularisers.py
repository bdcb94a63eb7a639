"""Sparsity regularisers on unit saliencies (gates or BatchNorm gamma)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from espn.supernet.supernet import Supernet


def flop_aware_lambdas(unit_flops: dict[str, float]) -> dict[str, float]:
    """lambda_l = sqrt(FLOP_l(m)) / sum_i sqrt(FLOP_i(m)): costly units are pushed down harder."""
    roots = {g: f**0.5 for g, f in unit_flops.items()}
    total = sum(roots.values())
    if total == 0:
        return dict.fromkeys(roots, 0.0)
    return {g: r / total for g, r in roots.items()}


class Regulariser(ABC):
    """A penalty added to the task loss while pruning; ``refresh`` follows the sub-network."""

    def __init__(self, strength: float) -> None:
        self.strength = strength

    def refresh(self, supernet: Supernet) -> None:
        """Recompute whatever depends on the current sub-network (called after each prune)."""

    def after_step(self, supernet: Supernet) -> None:
        """Called after every optimizer step of a task that prunes units (e.g. to clamp)."""

    @abstractmethod
    def __call__(self, supernet: Supernet) -> Tensor: ...


class WeightedL1(Regulariser):
    """strength * sum_l lambda_l * ||Gamma_l||_1 with one lambda per unit group."""

    lambdas: dict[str, float]

    def __call__(self, supernet: Supernet) -> Tensor:
        terms = [
            self.lambdas[g] * m.weight.abs().sum()
            for g, mods in supernet.groups.items()
            for m in mods
        ]
        return self.strength * torch.stack(terms).sum()


class FlopAwareL1(WeightedL1):
    """The paper's FLOP-aware L1 penalty (lambda_l from the current sub-network's FLOPs)."""

    def refresh(self, supernet: Supernet) -> None:
        self.lambdas = flop_aware_lambdas(supernet.unit_flops())


class UniformL1(WeightedL1):
    """Network slimming (Liu et al. 2017): the same lambda on every |gamma|."""

    def refresh(self, supernet: Supernet) -> None:
        self.lambdas = dict.fromkeys(supernet.groups, 1.0)
