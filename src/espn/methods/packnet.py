"""PackNet (Mallya & Lazebnik 2018) with ESPN's weight allocation."""

from __future__ import annotations

from espn.methods.base import METHODS, Phase, Strategy
from espn.supernet.supernet import Supernet


@METHODS.register("packnet")
class PackNet(Strategy):
    """Train free weights, keep the ceil(alpha x free) largest new ones, fine-tune.

    No FLOP constraint; every frozen weight is reused; gates/BatchNorm affine parameters are
    not trained (PackNet has no task-specific affine layers; ``--task-affine`` trains them as
    for every method), heads are. The warm-up and fine-tuning follow the run's recipe, as for
    every method.
    """

    name = "packnet"
    trains_unit_affine = False
    uses_gamma = False

    def phases(self) -> list[Phase]:
        pre, prune, fine = self.cfg.epochs
        return [
            *self.warmup_phases(),
            Phase("pretrain", pre + prune - self.cfg.warmup),
            Phase("prune", 0, prune_updates=1),
            self.finetune_phase(fine),
        ]

    def prune_step(self, supernet: Supernet, progress: float) -> None:
        self.prune_weights(supernet, 1.0, "all")
