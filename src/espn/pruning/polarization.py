"""Polarization (Zhuang et al. 2020), the appendix's second channel-pruning baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from espn.pruning.pruner import PRUNERS, Pruner, gate_magnitude
from espn.pruning.regularisers import Regulariser
from espn.pruning.schedule import GradualSchedule
from espn.settings.methods import POLARIZATION_T
from espn.supernet.supernet import Supernet


class Polarization(Regulariser):
    """``strength / n * sum_l sum_i (t |gamma_li| - |gamma_li - mean(gamma)|)``.

    The sum runs over every gate/BatchNorm ``l`` and its alive units ``i``; ``mean`` is the
    mean over all ``n`` alive saliencies of the network (Zhuang et al.'s gamma-bar). The
    second term rewards saliencies far from the mean, so they split into a group at 0 and a
    group well above it. After every optimizer step the saliencies are clamped to [0, 1].
    """

    slim_exact = True

    def __init__(self, strength: float, t: float = POLARIZATION_T) -> None:
        super().__init__(strength)
        self.t = t

    def __call__(self, supernet: Supernet) -> Tensor:
        mods = [m for group in supernet.groups.values() for m in group]
        gammas = torch.cat([m.weight for m in mods])
        alive = torch.cat([m.entry_mask() for m in mods]).to(gammas.dtype)
        n = alive.sum().clamp_min(1.0)
        mean = (gammas * alive).sum() / n
        polar = self.t * gammas.abs() - (gammas - mean).abs()
        return self.strength * (polar * alive).sum() / n

    @torch.no_grad()
    def after_step(self, supernet: Supernet) -> None:
        for mods in supernet.groups.values():
            for m in mods:
                m.weight.clamp_(0.0, 1.0)


@PRUNERS.register("polarization")
def polarization(
    gamma: float, strength: float, flop_load: str = "output", polarization_t: float = POLARIZATION_T
) -> Pruner:
    """Polarization (Zhuang et al. 2020): |gamma| saliency, polarizing penalty, global threshold."""
    return Pruner(gate_magnitude, Polarization(strength, polarization_t), GradualSchedule(gamma))
