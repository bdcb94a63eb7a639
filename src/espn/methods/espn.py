"""ESPN-gamma (Algorithm 1): pre-train, gradual joint unit and weight pruning, fine-tune."""

from __future__ import annotations

from torch import Tensor

from espn.methods.base import METHODS, MethodConfig, Phase, Strategy
from espn.pruning.pruner import PRUNERS
from espn.supernet.supernet import Supernet


@METHODS.register("espn")
class ESPN(Strategy):
    """Each task gets at most gamma x the dense FLOPs and ceil(alpha x free) new weights."""

    name = "espn"

    def __init__(self, cfg: MethodConfig) -> None:
        super().__init__(cfg)
        self.pruner = PRUNERS.get(cfg.pruner)(cfg.gamma, cfg.penalty)
        self.prunes_units = cfg.gamma < 1.0

    def phases(self) -> list[Phase]:
        pre, prune, fine = self.cfg.epochs
        updates = max(1, prune * self.cfg.prune_updates_per_epoch)
        return [
            Phase("pretrain", pre),
            Phase("prune", prune, regularise=self.prunes_units, prune_updates=updates),
            Phase("finetune", fine, cosine=True),
        ]

    def begin_task(self, supernet: Supernet) -> None:
        super().begin_task(supernet)
        self.pruner.refresh(supernet)

    def penalty(self, supernet: Supernet) -> Tensor | None:
        return self.pruner.penalty(supernet) if self.prunes_units else None

    def prune_step(self, supernet: Supernet, progress: float) -> None:
        if self.prunes_units:
            self.pruner.prune_units(supernet, progress)
        self.prune_weights(supernet, progress, self.cfg.reuse)
