"""A pruner is an importance score, a regulariser and a schedule, found by name in PRUNERS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from espn.pruning.regularisers import FlopAwareL1, Regulariser, UniformL1
from espn.pruning.schedule import GradualSchedule
from espn.pruning.selection import select_units
from espn.registry import Registry
from espn.supernet.supernet import Supernet

Importance = Callable[[Supernet], dict[str, Tensor]]


def gate_magnitude(supernet: Supernet) -> dict[str, Tensor]:
    """Unit saliency |gamma|, averaged over the gates/BatchNorms that share a unit group."""
    return {
        g: torch.stack([m.saliency() for m in mods]).mean(0) for g, mods in supernet.groups.items()
    }


@dataclass
class Pruner:
    """Removes units (neurons/channels) down to the schedule's FLOPs target."""

    importance: Importance
    regulariser: Regulariser
    schedule: GradualSchedule

    def penalty(self, supernet: Supernet) -> Tensor:
        return self.regulariser(supernet)

    def refresh(self, supernet: Supernet) -> None:
        self.regulariser.refresh(supernet)

    def after_step(self, supernet: Supernet) -> None:
        self.regulariser.after_step(supernet)

    def state_dict(self) -> dict:
        """The regulariser's state (e.g. the effective lambdas the last prune step set)."""
        return self.regulariser.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (a task resumed mid-way)."""
        self.regulariser.load_state_dict(state)

    def prune_units(self, supernet: Supernet, progress: float) -> None:
        """Apply the FLOPs target at ``progress`` (1.0 = the final budget gamma)."""
        target = self.schedule.flops_fraction(progress) * supernet.dense_flops
        units = select_units(
            self.importance(supernet),
            supernet.unit_masks(),
            supernet.flops,
            target,
        )
        supernet.set_unit_masks(units)
        self.refresh(supernet)


#: ``factory(gamma, strength, flop_load, **own)``; ``flop_load`` (see ``espn.supernet.flops``)
#: matters to FLOP-aware penalties only; ``own`` are the values of the pruner's own options
PrunerFactory = Callable[..., Pruner]
PRUNERS: Registry[PrunerFactory] = Registry("pruner")


@PRUNERS.register("flop-aware")
def flop_aware(gamma: float, strength: float, flop_load: str = "output") -> Pruner:
    """ESPN's pruner: |gamma| saliency, FLOP-aware L1, gradual FLOPs schedule."""
    return Pruner(gate_magnitude, FlopAwareL1(strength, flop_load), GradualSchedule(gamma))


@PRUNERS.register("l1")
def network_slimming(gamma: float, strength: float, flop_load: str = "output") -> Pruner:
    """Network slimming: |gamma| saliency, one uniform L1 lambda, global threshold."""
    return Pruner(gate_magnitude, UniformL1(strength), GradualSchedule(gamma))
