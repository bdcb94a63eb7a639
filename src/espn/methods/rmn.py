"""RMN (Kaushik et al. 2021): relevance mapping networks, task identity given."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from espn.methods.base import METHODS, Phase, Strategy
from espn.pruning.weights import select_weights
from espn.settings.methods import METHOD_OPTIONS
from espn.settings.training import TrainingSettings
from espn.supernet.layers import MaskedLayer
from espn.supernet.supernet import Supernet


@METHODS.register("rmn")
class RMN(Strategy):
    """Each task learns a relevance map over all weights, L1-regularised, then binarised:
    phases ``train``, ``binarise`` (by ``rmn_threshold``, or ``rmn_budget``) and
    ``finetune``; frozen weights enter through ``rmn_frozen_map`` and are only selected,
    never changed (docs/methods.md; where it differs from the paper: docs/fidelity.md)."""

    trains_unit_affine = False
    uses_gamma = False
    uses_alpha = False
    #: relevances train with the weights' optimizer; free weights keep the previous task's
    #: values (no ``free_init``): why, docs/fidelity.md
    options = METHOD_OPTIONS["rmn"]
    own_parameters = ("relevance", "relevance_layers")

    @classmethod
    def check_config(cls, cfg: TrainingSettings) -> None:
        """RMN has no ``alpha``: its weight allocation is the ``rmn_budget`` option."""
        if cfg.alpha != 1.0:
            raise ValueError(
                f"method 'rmn' has no weight budget (alpha), as in its paper; alpha must be 1 "
                f"or unset, got {cfg.alpha} (--rmn-budget {cfg.alpha:g} keeps espn's weight "
                "allocation)"
            )
        super().check_config(cfg)

    def capacity_hint(self) -> str:
        """RMN's threshold rule keeps every free weight whose relevance the L1 term left high."""
        return (
            "without --rmn-budget, an RMN task keeps every free weight whose relevance stays "
            f"above --rmn-threshold ({self.threshold:g}), which at --rmn-l1 {self.l1:g} on a "
            "short run is nearly all of them; give --rmn-budget B (keep floor(B x free) new "
            "weights per layer), a larger --rmn-l1, fewer --tasks or a wider model"
        )

    def __init__(self, cfg: TrainingSettings) -> None:
        super().__init__(cfg)
        self.l1: float = self.settings["rmn_l1"]
        self.budget: float = self.settings["rmn_budget"]
        self.threshold: float = self.settings["rmn_threshold"]
        self.binary_frozen: bool = self.settings["rmn_frozen_map"] == "binary"
        self.relevance: dict[str, nn.Parameter] = {}
        self.binarised = False

    def phases(self) -> list[Phase]:
        return self.joint_phases("train", True, [Phase("binarise", 0, prune_updates=1)])

    def begin_task(self, supernet: Supernet) -> None:
        super().begin_task(supernet)
        if self.budget > 0:  # espn's weight allocation, at rmn_budget in place of alpha
            self.weight_budget = supernet.weight_budget(self.budget)
            self.layer_budgets = {
                n: math.floor(self.budget * f) for n, f in self.layer_free.items()
            }
        self.binarised = False
        self.relevance = {
            n: nn.Parameter(torch.ones_like(layer.weight)) for n, layer in supernet.layers.items()
        }

    def state_dict(self) -> dict[str, Any]:
        """Budgets, whether the map is binary yet, and the relevance maps (tensors)."""
        return super().state_dict() | {"binarised": self.binarised}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.binarised = bool(state["binarised"])

    def forward(self, supernet: Supernet, x: Tensor) -> Tensor:
        if self.binarised:
            return supernet.forward_working(x)
        masks = {
            f"{n}.weight_mask": self.training_map(n, layer) * layer.weight_mask
            for n, layer in supernet.layers.items()
        }
        return functional_call(supernet.model, masks, (x,))

    def training_map(self, name: str, layer: MaskedLayer) -> Tensor:
        """The relevance map of one layer in training: real-valued on free weights; on frozen
        ones the binary map they will keep (``relevance > threshold``), exactly, with the
        relevance's gradient passed straight through, unless ``rmn_frozen_map`` is soft."""
        relevance = self.relevance[name]
        if not self.binary_frozen:
            return relevance
        kept = self.frozen_kept(relevance).to(relevance.dtype)
        return torch.where(layer.frozen, kept + (relevance - relevance.detach()), relevance)

    def frozen_kept(self, relevance: Tensor) -> Tensor:
        """Under the binary frozen map, which frozen weights are in the task: one rule for
        training and binarising, so that the two agree."""
        return relevance > self.threshold

    def penalty(self, supernet: Supernet) -> Tensor | None:
        if self.binarised or self.l1 == 0.0:
            return None
        l1 = sum((r.abs().sum() for r in self.relevance.values()), torch.zeros(()))
        return self.l1 * l1

    @torch.no_grad()
    def prune_step(self, supernet: Supernet, progress: float) -> None:
        """Binarise the relevance maps: |relevance| above the threshold, or the largest
        within the weight budget; frozen weights as they entered training."""
        masks = {}
        for n, layer in supernet.layers.items():
            relevance = self.relevance[n].detach()
            if self.budget > 0:
                candidates = torch.ones_like(layer.frozen)
                keep = select_weights(
                    relevance, candidates, layer.frozen, self.layer_budgets[n], "magnitude"
                )
            else:
                keep = relevance.abs() > self.threshold
            if self.binary_frozen:
                keep = torch.where(layer.frozen, self.frozen_kept(relevance), keep)
            layer.weight.copy_(
                torch.where(keep & ~layer.frozen, layer.weight * relevance, layer.weight)
            )
            masks[n] = keep
        supernet.set_weight_masks(masks)
        self.binarised = True
