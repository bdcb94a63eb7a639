"""ESPN-gamma (Algorithm 1): pre-train, gradual joint unit and weight pruning, fine-tune."""

from __future__ import annotations

from typing import Any

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

    def state_dict(self) -> dict[str, Any]:
        """Budgets and the penalty's per-group lambdas (as the last prune step left them)."""
        lambdas = getattr(self.pruner.regulariser, "lambdas", None)
        return super().state_dict() | {"lambdas": None if lambdas is None else dict(lambdas)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("lambdas") is not None:
            self.pruner.regulariser.lambdas = {g: float(v) for g, v in state["lambdas"].items()}

    def penalty(self, supernet: Supernet) -> Tensor | None:
        return self.pruner.penalty(supernet) if self.prunes_units else None

    def after_step(self, supernet: Supernet) -> None:
        if self.prunes_units:
            self.pruner.after_step(supernet)

    def prune_step(self, supernet: Supernet, progress: float) -> None:
        if self.prunes_units:
            self.pruner.prune_units(supernet, progress)
        self.prune_weights(supernet, progress, self.cfg.reuse)
