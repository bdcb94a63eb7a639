"""Polarization (Zhuang et al. 2020), the appendix's second channel-pruning baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from espn.pruning.pruner import PRUNERS, Pruner, gate_magnitude
from espn.pruning.regularisers import Regulariser
from espn.pruning.schedule import GradualSchedule
from espn.supernet.supernet import Supernet

#: the weight t of the L1 term; Zhuang et al. use t in about [1.2, 1.5] (t > 1 keeps the
#: penalty bounded below so it pushes some saliencies to 0 and the others away from them)
POLARIZATION_T = 1.2


class Polarization(Regulariser):
    """``strength * sum_l sum_i (t |gamma_li| - |gamma_li - mean_l(gamma)|)``.

    The sum runs over every gate/BatchNorm ``l`` and its alive units ``i``; ``mean_l`` is the
    mean over those alive units. The second term rewards saliencies far from their layer's
    mean, so they split into a group at 0 and a group well above it. After every optimizer
    step the saliencies are clamped to [0, 1], as in the paper.
    """

    def __init__(self, strength: float, t: float = POLARIZATION_T) -> None:
        super().__init__(strength)
        self.t = t

    def __call__(self, supernet: Supernet) -> Tensor:
        terms = []
        for mods in supernet.groups.values():
            for m in mods:
                alive = m.unit_mask.to(m.weight.dtype)
                mean = (m.weight * alive).sum() / alive.sum().clamp_min(1.0)
                polar = self.t * m.weight.abs() - (m.weight - mean).abs()
                terms.append((polar * alive).sum())
        return self.strength * torch.stack(terms).sum()

    @torch.no_grad()
    def after_step(self, supernet: Supernet) -> None:
        for mods in supernet.groups.values():
            for m in mods:
                m.weight.clamp_(0.0, 1.0)


@PRUNERS.register("polarization")
def polarization(gamma: float, strength: float) -> Pruner:
    """Polarization (Zhuang et al. 2020): |gamma| saliency, polarizing penalty, global threshold."""
    return Pruner(gate_magnitude, Polarization(strength), GradualSchedule(gamma))
