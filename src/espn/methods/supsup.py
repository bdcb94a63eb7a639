"""SupSup (Wortsman et al. 2020): supermasks over fixed random weights, task identity given."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from espn.methods.base import METHODS, MethodConfig, Phase, Strategy
from espn.methods.options import Option
from espn.supernet.supernet import Supernet


class _TopK(torch.autograd.Function):
    """The k largest entries -> 1, the rest -> 0; the gradient passes straight through."""

    @staticmethod
    def forward(ctx: Any, scores: Tensor, k: int) -> Tensor:
        flat = scores.detach().flatten()
        mask = torch.zeros_like(flat)
        mask[flat.topk(k, sorted=False).indices] = 1.0
        return mask.view_as(scores)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def supermask(scores: Tensor, k: float) -> Tensor:
    """The supermask of one layer: 1 on the ``ceil(k x numel)`` largest |scores|, else 0.

    Differentiable with the straight-through estimator: d mask / d |scores| = 1.
    """
    n_keep = max(1, math.ceil(k * scores.numel()))
    return _TopK.apply(scores.abs(), n_keep)


@METHODS.register("supsup")
class SupSup(Strategy):
    """Fixed signed-constant weights; each task learns one top-k supermask per layer.

    The shared weights are set once to +-sqrt(2 / (k x fan_in)) with the signs of the
    seeded initialisation and never trained (``weights = "fixed"``). Per task, a real score
    per weight is trained through the straight-through estimator; the task keeps the top-k
    scores' mask (stored bit-packed), its own BatchNorm statistics (affine parameters fixed
    at 1 and 0, gates of FC layers likewise) and its head (trained). No FLOP constraint.
    """

    name = "supsup"
    weights = "fixed"
    uses_gamma = False
    uses_alpha = False
    trains_unit_affine = False
    accepts_pretrained = False
    options = (
        Option(
            "supsup_k",
            float,
            0.5,
            "fraction of each layer's weights in a supermask",
            low=0.0,
            low_open=True,
            high=1.0,
        ),
    )

    def __init__(self, cfg: MethodConfig) -> None:
        super().__init__(cfg)
        self.k: float = self.settings["supsup_k"]
        self.scores: dict[str, nn.Parameter] = {}

    def phases(self) -> list[Phase]:
        pre, prune, fine = self.cfg.epochs
        return [
            *self.warmup_phases(),
            Phase("train", pre + prune - self.cfg.warmup),
            self.finetune_phase(fine),
            Phase("mask", 0, prune_updates=1),
        ]

    @torch.no_grad()
    def attach(self, supernet: Supernet) -> None:
        """Turn the seeded initial weights into signed constants (idempotent) that get no
        gradient."""
        for layer in supernet.layers.values():
            fan_in = layer.weight[0].numel()
            scale = math.sqrt(2.0 / (self.k * fan_in))
            layer.weight.copy_(torch.where(layer.weight >= 0, scale, -scale))
            layer.weight.requires_grad_(False)

    def begin_task(self, supernet: Supernet) -> None:
        super().begin_task(supernet)
        self.weight_budget = 0  # no weight is ever trained
        self.scores = {}
        for name, layer in supernet.layers.items():
            scores = torch.empty_like(layer.weight)
            nn.init.kaiming_uniform_(scores, a=math.sqrt(5))
            self.scores[name] = nn.Parameter(scores)

    def state_dict(self) -> dict[str, Any]:
        """Budgets and the task's scores (tensors, which the checkpoint stores apart)."""
        state = super().state_dict() | {"score_layers": list(self.scores)}
        return state | {f"scores.{n}": s.detach() for n, s in self.scores.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.scores = {
            n: nn.Parameter(state[f"scores.{n}"].detach().clone()) for n in state["score_layers"]
        }

    def extra_parameters(self) -> list[nn.Parameter]:
        return list(self.scores.values())

    def forward(self, supernet: Supernet, x: Tensor) -> Tensor:
        masks = {f"{n}.weight_mask": supermask(s, self.k) for n, s in self.scores.items()}
        return functional_call(supernet.model, masks, (x,))

    @torch.no_grad()
    def prune_step(self, supernet: Supernet, progress: float) -> None:
        """Fix the task's supermasks (the top-k of its trained scores)."""
        supernet.set_weight_masks({n: supermask(s, self.k).bool() for n, s in self.scores.items()})
