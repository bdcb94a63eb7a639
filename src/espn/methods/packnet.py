"""PackNet (Mallya & Lazebnik 2018) as the authors' baseline: with ESPN's weight allocation.

Its recipe is the authors' PackNet baseline (ucr-optml/CtRL ``utils/PackNet_manager.py``,
``utils/PackNet_manager_small.py``): gradual magnitude pruning over the pruning epochs, free
weights re-initialised (Kaiming) per task, non-affine BatchNorm, and on the MNIST regime
fine-tuning with cosine decay from 1e-3; the L2 term on the masked weights in the loss
(``masked_l2``, the authors' ``lam`` 1).
"""

from __future__ import annotations

from typing import ClassVar

from espn.methods.base import METHODS, Phase, Recipes, Strategy
from espn.settings.methods import METHOD_OPTIONS
from espn.supernet.supernet import Supernet


@METHODS.register("packnet")
class PackNet(Strategy):
    """Train free weights, prune them gradually to the ceil(alpha x free) largest new ones,
    fine-tune.

    No FLOP constraint; every frozen weight is reused; gates/BatchNorm affine parameters are
    not trained (the authors' baseline has non-affine BatchNorm; ``--task-affine`` trains
    them as for every method), heads are. ``packnet_prune one-shot`` prunes once at the end
    of the pruning epochs instead (Mallya & Lazebnik's original, espn before 0.2).
    """

    name = "packnet"
    trains_unit_affine = False
    uses_gamma = False
    recipe: ClassVar[Recipes] = {"mnist": {"finetune_lr": 1e-3, "finetune_schedule": "cosine"}}
    options = METHOD_OPTIONS["packnet"]

    def phases(self) -> list[Phase]:
        pre, prune, fine = self.cfg.epochs
        if self.settings.get("packnet_prune") == "one-shot":
            return [
                *self.warmup_phases(),
                Phase("pretrain", pre + prune - self.cfg.warmup),
                Phase("prune", 0, prune_updates=1),
                self.finetune_phase(fine),
            ]
        return [
            *self.warmup_phases(),
            Phase("pretrain", pre - self.cfg.warmup),
            Phase("prune", prune, prune_updates=max(1, prune * self.cfg.prune_updates_per_epoch)),
            self.finetune_phase(fine),
        ]

    def prune_step(self, supernet: Supernet, progress: float) -> None:
        self.prune_weights(supernet, progress, "all")
