"""ESPN-gamma (Algorithm 1): pre-train, gradual joint unit and weight pruning, fine-tune, with
the authors' recipe (ucr-optml/CtRL; docs/fidelity.md)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from espn.methods.base import METHODS, Phase, Strategy
from espn.pruning.pruner import PRUNERS
from espn.settings.methods import METHOD_OPTIONS, PRUNER_OPTIONS
from espn.settings.training import TrainingSettings
from espn.supernet.supernet import Supernet


@METHODS.register("espn")
class ESPN(Strategy):
    """Each task gets at most gamma x the dense FLOPs and ceil(alpha x free) new weights."""

    options = METHOD_OPTIONS["espn"]
    trains_slim = True

    def __init__(self, cfg: TrainingSettings) -> None:
        super().__init__(cfg)
        pruner = self.settings["pruner"]
        own = {o.name: self.settings[o.name] for o in PRUNER_OPTIONS.get(pruner, ())}
        self.pruner = PRUNERS.get(pruner)(
            cfg.gamma, self.settings["penalty"], self.settings["flop_load"], **own
        )

    @property
    def prunes_units(self) -> bool:
        return self.cfg.gamma < 1.0

    @property
    def prunes_slim(self) -> bool:
        """Where units are pruned, by a pruner whose penalty a slim copy computes exactly."""
        return self.prunes_units and self.pruner.regulariser.slim_exact

    def phases(self) -> list[Phase]:
        """Warm-up, pre-training and gradual pruning (both with the penalty, as the authors),
        then fine-tuning."""
        return self.gradual_phases(regularise=self.prunes_units)

    def begin_task(self, supernet: Supernet) -> None:
        super().begin_task(supernet)
        self.pruner.regulariser.refresh(supernet)

    def state_dict(self) -> dict[str, Any]:
        """Budgets and the penalty's state (its lambdas as the last prune step left them)."""
        return super().state_dict() | {"pruner": self.pruner.regulariser.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("pruner"):
            self.pruner.regulariser.load_state_dict(state["pruner"])
        elif state.get("lambdas") is not None:  # a task in training saved by espn 0.1
            self.pruner.regulariser.load_state_dict({"lambdas": state["lambdas"]})

    def report(self) -> dict[str, Any]:
        """The effective per-unit penalty weight of every unit group at the end of pruning."""
        return {"penalty_lambdas": self.pruner.regulariser.state_dict().get("lambdas")}

    def penalty(self, supernet: Supernet) -> Tensor | None:
        return self.pruner.regulariser(supernet) if self.prunes_units else None

    def after_step(self, supernet: Supernet) -> None:
        if self.prunes_units:
            self.pruner.regulariser.after_step(supernet)

    def prune_step(self, supernet: Supernet, progress: float) -> None:
        if self.prunes_units:
            self.pruner.prune_units(supernet, progress)
        self.prune_weights(supernet, progress, self.settings["reuse"])
        if progress >= 1.0:
            supernet.release_gates()
