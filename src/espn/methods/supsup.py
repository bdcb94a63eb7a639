"""SupSup (Wortsman et al. 2020): supermasks over fixed random weights, task identity given."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.func import functional_call

from espn.methods.base import METHODS, MethodConfig, Phase, Recipes, Strategy
from espn.options import Option
from espn.supernet.layers import TaskHead
from espn.supernet.supernet import Supernet
from espn.training.optim import OptimConfig


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


def signed_constant(weight: Tensor, k: float) -> Tensor:
    """+-sqrt(2 / (k x fan_in)) with the signs of ``weight`` (SupSup's signed constants)."""
    scale = math.sqrt(2.0 / (k * weight[0].numel()))
    return torch.where(weight >= 0, scale, -scale)


@METHODS.register("supsup")
class SupSup(Strategy):
    """Fixed signed-constant weights; each task learns one top-k supermask per layer.

    As RAIVNLab/supsup (``main.py``, ``args.py``, ``rn18-supsup.yaml``): the shared weights
    are set once to +-sqrt(2 / (k x fan_in)) with the signs of the seeded initialisation and
    never trained (``weights = "fixed"``). Per task, a real score per weight (initialised
    uniformly within +-1/sqrt(fan_in)) is trained through the straight-through estimator with
    its own Adam (betas 0.9, 0.999; lr 1e-3, ``supsup_lr``; weight decay 1e-4; cosine decay
    over all the task's epochs); the task keeps the top-k scores' mask (stored bit-packed)
    and its own BatchNorm statistics (affine parameters fixed at 1 and 0, gates of FC layers
    likewise). The task's head is masked the same way: signed constants (zero bias) under a
    top-k mask of its own scores; ``supsup_head dense`` trains a dense head with a bias with
    the run's optimizer instead (espn before 0.2). No FLOP constraint.
    """

    name = "supsup"
    weights = "fixed"
    uses_gamma = False
    uses_alpha = False
    trains_unit_affine = False
    accepts_pretrained = False
    recipe: ClassVar[Recipes] = {"mnist": {"warmup": 0}, "cifar": {"warmup": 0}}
    own_optim = OptimConfig("adam", 1e-3, 1e-4, 0.0, (0.9, 0.999), schedule="cosine")
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
        Option("supsup_lr", float, 1e-3, "learning rate of the scores", low=0.0, low_open=True),
        Option(
            "supsup_head",
            str,
            "masked",
            "a task's head: masked (signed constants under a supermask, the reference) or "
            "dense (trained with a bias)",
            choices=("masked", "dense"),
        ),
    )

    def __init__(self, cfg: MethodConfig) -> None:
        super().__init__(cfg)
        self.k: float = self.settings["supsup_k"]
        self.scores: dict[str, nn.Parameter] = {}

    def own_optimizer(self) -> OptimConfig | None:
        """The scores' Adam, at ``supsup_lr``."""
        return replace(self.own_optim, lr=self.settings["supsup_lr"]) if self.own_optim else None

    def _heads(self, supernet: Supernet) -> dict[str, TaskHead]:
        """The task heads it masks (none with ``supsup_head dense``)."""
        if self.settings["supsup_head"] != "masked":
            return {}
        return {n: m for n, m in supernet.task_modules.items() if isinstance(m, TaskHead)}

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
            layer.weight.copy_(signed_constant(layer.weight, self.k))
            layer.weight.requires_grad_(False)

    def begin_task(self, supernet: Supernet) -> None:
        super().begin_task(supernet)
        self.weight_budget = 0  # no weight is ever trained
        self.scores = {}
        weights = {n: m.weight for n, m in supernet.layers.items()}
        for name, head in self._heads(supernet).items():
            with torch.no_grad():
                head.weight.copy_(signed_constant(head.weight, self.k))
                head.bias.zero_()
            weights[name] = head.weight
        for name, weight in weights.items():
            scores = torch.empty_like(weight)
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
        tensors = {}
        for n, s in self.scores.items():
            if n in supernet.layers:
                tensors[f"{n}.weight_mask"] = supermask(s, self.k)
            else:  # a masked head: its fixed signed constants under the supermask, no bias
                weight = supernet.task_modules[n].get_parameter("weight")
                tensors[f"{n}.weight"] = weight.detach() * supermask(s, self.k)
                tensors[f"{n}.bias"] = weight.new_zeros(weight.shape[0])
        return functional_call(supernet.model, tensors, (x,))

    @torch.no_grad()
    def prune_step(self, supernet: Supernet, progress: float) -> None:
        """Fix the task's supermasks (the top-k of its trained scores); a masked head keeps
        its masked signed constants."""
        supernet.set_weight_masks(
            {n: supermask(s, self.k).bool() for n, s in self.scores.items() if n in supernet.layers}
        )
        for name, head in self._heads(supernet).items():
            head.weight.mul_(supermask(self.scores[name], self.k))
