"""PackNet (Mallya & Lazebnik 2018) as the authors' baseline, with ESPN's weight allocation
and their recipe (ucr-optml/CtRL ``utils/PackNet_manager.py``; docs/fidelity.md)."""

from __future__ import annotations

from typing import ClassVar

from espn.methods.base import METHODS, Phase, Recipes, Strategy
from espn.settings.methods import METHOD_OPTIONS
from espn.supernet.supernet import Supernet


@METHODS.register("packnet")
class PackNet(Strategy):
    """Train free weights, prune them gradually to the ceil(alpha x free) largest new ones,
    fine-tune; every frozen weight is reused, gates/BatchNorm affine parameters are not
    trained (``packnet_prune one-shot``: one prune at the end, see docs/methods.md)."""

    trains_unit_affine = False
    uses_gamma = False
    recipe: ClassVar[Recipes] = {"mnist": {"finetune_lr": 1e-3, "finetune_schedule": "cosine"}}
    options = METHOD_OPTIONS["packnet"]

    def phases(self) -> list[Phase]:
        if self.settings.get("packnet_prune") == "one-shot":
            return self.joint_phases("pretrain", then=[Phase("prune", 0, prune_updates=1)])
        return self.gradual_phases()

    def prune_step(self, supernet: Supernet, progress: float) -> None:
        self.prune_weights(supernet, progress, "all")
