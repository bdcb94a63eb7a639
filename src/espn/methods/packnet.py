"""PackNet (Mallya & Lazebnik 2018) with ESPN's weight allocation."""

from __future__ import annotations

from espn.methods.base import METHODS, Phase, Strategy
from espn.supernet.supernet import Supernet


@METHODS.register("packnet")
class PackNet(Strategy):
    """Train free weights, keep the ceil(alpha x free) largest new ones, fine-tune.

    No FLOP constraint; every frozen weight is reused; gates/BatchNorm affine parameters are
    not trained (PackNet has no task-specific affine layers), heads are.
    """

    name = "packnet"
    train_unit_affine = False
    uses_gamma = False

    def phases(self) -> list[Phase]:
        pre, prune, fine = self.cfg.epochs
        return [
            Phase("pretrain", pre + prune),
            Phase("prune", 0, prune_updates=1),
            Phase("finetune", fine, cosine=True),
        ]

    def prune_step(self, supernet: Supernet, progress: float) -> None:
        self.prune_weights(supernet, 1.0, "all")
