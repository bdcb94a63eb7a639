"""A pruner is an importance score, a regulariser and the gradual FLOPs schedule, found by name
in PRUNERS; it chooses which units (neurons/channels) a task keeps."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from espn.pruning.regularisers import FlopAwareL1, Polarization, Regulariser, UniformL1
from espn.registry import Registry
from espn.settings.methods import POLARIZATION_T
from espn.supernet.supernet import Supernet

Importance = Callable[[Supernet], dict[str, Tensor]]


def gate_magnitude(supernet: Supernet) -> dict[str, Tensor]:
    """Unit saliency |gamma|, averaged over the gates/BatchNorms that share a unit group."""
    return {
        g: torch.stack([m.saliency() for m in mods]).mean(0) for g, mods in supernet.groups.items()
    }


def select_units(
    saliency: dict[str, Tensor],
    alive: dict[str, Tensor],
    flops_of: Callable[[dict[str, Tensor]], float],
    flops_target: float,
) -> dict[str, Tensor]:
    """Drop the least salient alive units, one global threshold over all groups, until
    ``flops_of(alive units) <= flops_target`` (``flops_of`` reads the alive vectors, so that a
    residual stream read as the union of its producers' groups is counted as it is).

    The most salient unit of every group is never dropped, so that no layer is cut off
    entirely; if the target cannot be met without that, those units alone remain.
    """
    groups = list(saliency)
    scores = []
    for g in groups:
        s = saliency[g].detach().float().to(alive[g].device, copy=True)
        s[~alive[g]] = -torch.inf
        keep = torch.topk(s, min(1, s.numel())).indices
        s[keep] = torch.inf
        scores.append(s)
    flat = torch.cat(scores)
    rank = torch.empty_like(flat, dtype=torch.long)
    rank[torch.argsort(flat, stable=True)] = torch.arange(flat.numel(), device=flat.device)
    ranks = dict(zip(groups, rank.split([s.numel() for s in scores]), strict=True))
    n_dead = int(torch.isneginf(flat).sum())
    n_removable = int(torch.isfinite(flat).sum())

    def alive_after(k: int) -> dict[str, Tensor]:
        return {g: ranks[g] >= k for g in groups}

    lo, hi = n_dead, n_dead + n_removable
    if flops_of(alive_after(lo)) <= flops_target:
        return alive_after(lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if flops_of(alive_after(mid)) <= flops_target:
            hi = mid
        else:
            lo = mid
    return alive_after(hi)


@dataclass
class Pruner:
    """Removes units (neurons/channels) down to the FLOPs target of the gradual schedule
    ending at ``gamma``; :attr:`regulariser` is the penalty added to the loss meanwhile."""

    importance: Importance
    regulariser: Regulariser
    gamma: float

    def flops_fraction(self, progress: float) -> float:
        """The FLOPs target at ``progress`` in [0, 1] (1 at the last pruning update): the width
        shrinks linearly to ``sqrt(gamma)``, so the FLOPs end at ``gamma`` of the dense ones."""
        return (1.0 - progress * (1.0 - math.sqrt(self.gamma))) ** 2

    def prune_units(self, supernet: Supernet, progress: float) -> None:
        """Apply the FLOPs target at ``progress`` (1.0 = the final budget gamma)."""
        target = self.flops_fraction(progress) * supernet.dense_flops
        units = select_units(
            self.importance(supernet), supernet.unit_masks(), supernet.flops, target
        )
        supernet.set_unit_masks(units)
        self.regulariser.refresh(supernet)


#: ``factory(gamma, strength, flop_load, **own)``; ``flop_load`` (see ``espn.supernet.flops``)
#: matters to FLOP-aware penalties only; ``own`` are the values of the pruner's own options
PrunerFactory = Callable[..., Pruner]
PRUNERS: Registry[PrunerFactory] = Registry("pruner")


@PRUNERS.register("flop-aware")
def flop_aware(gamma: float, strength: float, flop_load: str = "output") -> Pruner:
    """ESPN's pruner: |gamma| saliency, FLOP-aware L1, gradual FLOPs schedule."""
    return Pruner(gate_magnitude, FlopAwareL1(strength, flop_load), gamma)


@PRUNERS.register("l1")
def network_slimming(gamma: float, strength: float, flop_load: str = "output") -> Pruner:
    """Network slimming: |gamma| saliency, one uniform L1 lambda, global threshold."""
    return Pruner(gate_magnitude, UniformL1(strength), gamma)


@PRUNERS.register("polarization")
def polarization(
    gamma: float, strength: float, flop_load: str = "output", polarization_t: float = POLARIZATION_T
) -> Pruner:
    """Polarization (Zhuang et al. 2020), the appendix's second channel-pruning baseline:
    |gamma| saliency, polarizing penalty, global threshold."""
    return Pruner(gate_magnitude, Polarization(strength, polarization_t), gamma)
