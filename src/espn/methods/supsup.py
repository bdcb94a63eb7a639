"""SupSup (Wortsman et al. 2020): supermasks over fixed random weights, task identity given."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.func import functional_call

from espn.methods.base import METHODS, Phase, Recipes, Strategy
from espn.settings.methods import METHOD_OPTIONS, resolve_settings
from espn.settings.training import OptimConfig, TrainingSettings
from espn.supernet.layers import TaskHead
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


#: the reference's cap on one layer's Erdos-Renyi density
ER_CAP = 0.5


def er_density(shape: tuple[int, ...], s: float) -> float:
    """The reference's Erdos-Renyi density of a layer of weight ``shape`` at scale ``s``:
    ``min(0.5, s (c_out + c_in) / (c_out c_in kh kw))``, ``c_in`` per group (the weight's
    second dimension, as the reference's ``weight.size(1)``)."""
    return min(ER_CAP, s * (shape[0] + shape[1]) / math.prod(shape))


def erdos_renyi_scale(shapes: Sequence[tuple[int, ...]], k: float) -> float:
    """The scale ``s`` at which layers of these weight shapes keep ``k`` of all their
    weights together under :func:`er_density` (the reference gives ``s`` itself).

    The kept count ``sum_l min(n_l / 2, s (c_out + c_in))`` is piecewise linear in ``s``:
    layers whose cap binds are fixed at half their weights and ``s`` is solved over the
    rest, until no further layer reaches its cap. Needs ``k <= 0.5`` (every layer at its cap
    keeps half); at ``k = 0.5``, the smallest ``s`` that caps every layer.
    """
    if not 0.0 < k <= ER_CAP:
        raise ValueError(
            f"supsup_k must be in (0, {ER_CAP:g}] with supsup_density erdos-renyi (a layer "
            f"keeps at most {ER_CAP:g} of its weights, as in the reference), got {k}"
        )
    size = [math.prod(shape) for shape in shapes]
    slope = [shape[0] + shape[1] for shape in shapes]  # d kept / d s of an uncapped layer
    target, capped = k * sum(size), set[int]()
    while len(capped) < len(shapes):
        free = [i for i in range(len(shapes)) if i not in capped]
        rest = target - sum(ER_CAP * size[i] for i in capped)
        s = rest / sum(slope[i] for i in free)
        newly = {i for i in free if s * slope[i] >= ER_CAP * size[i]}
        if not newly:
            return s
        capped |= newly
    return max((ER_CAP * n / d for n, d in zip(size, slope, strict=True)), default=0.0)


def signed_constant(weight: Tensor, k: float = 1.0) -> Tensor:
    """+-sqrt(2 / (k x fan_in)) with the signs of ``weight``: SupSup's signed constants
    (``k = 1``, the reference's ``init.signed_constant``), or scaled up for a supermask that
    keeps ``k`` of the layer (Ramanujan et al.'s scaled fan-in)."""
    scale = math.sqrt(2.0 / (k * weight[0].numel()))
    return torch.where(weight >= 0, scale, -scale)


@METHODS.register("supsup")
class SupSup(Strategy):
    """Fixed signed-constant weights (``weights = "fixed"``); each task learns one top-k
    supermask per layer (and of its head, ``supsup_head``) through its scores, trained with
    their own Adam (docs/methods.md; the reference RAIVNLab/supsup: docs/fidelity.md)."""

    weights = "fixed"
    uses_gamma = False
    uses_alpha = False
    trains_unit_affine = False
    accepts_pretrained = False
    recipe: ClassVar[Recipes] = {"mnist": {"warmup": 0}, "cifar": {"warmup": 0}}
    own_optim = OptimConfig("adam", 1e-3, 1e-4, 0.0, (0.9, 0.999), schedule="cosine")
    own_lr = "supsup_lr"
    own_parameters = ("scores", "score_layers")
    options = METHOD_OPTIONS["supsup"]

    @classmethod
    def check_config(cls, cfg: TrainingSettings) -> None:
        """Erdos-Renyi densities are capped at 0.5, so ``supsup_k`` may not exceed it."""
        super().check_config(cfg)
        settings = resolve_settings(cls.name, cls.options, cfg.method_options)
        if settings["supsup_density"] == "erdos-renyi":
            erdos_renyi_scale([], settings["supsup_k"])

    def __init__(self, cfg: TrainingSettings) -> None:
        super().__init__(cfg)
        self.k: float = self.settings["supsup_k"]
        self.scores: dict[str, nn.Parameter] = {}
        #: Erdos-Renyi's ``s`` (None: uniform densities), solved over the shared layers
        self.er_scale: float | None = None

    def density_of(self, shape: tuple[int, ...]) -> float:
        """The supermask density of a layer of weight ``shape`` (see ``supsup_density``)."""
        return self.k if self.er_scale is None else er_density(shape, self.er_scale)

    def constants(self, weight: Tensor) -> Tensor:
        """The signed constants of a layer with the signs of ``weight`` (``supsup_scale``)."""
        if self.settings["supsup_scale"] == "fan-in":
            return signed_constant(weight)
        return signed_constant(weight, self.density_of(tuple(weight.shape)))

    def _heads(self, supernet: Supernet) -> dict[str, TaskHead]:
        """The task heads it masks (none with ``supsup_head dense``)."""
        if self.settings["supsup_head"] != "masked":
            return {}
        return {n: m for n, m in supernet.task_modules.items() if isinstance(m, TaskHead)}

    def phases(self) -> list[Phase]:
        return [*self.joint_phases("train"), Phase("mask", 0, prune_updates=1)]

    @torch.no_grad()
    def attach(self, supernet: Supernet) -> None:
        """Solve the layers' densities (Erdos-Renyi's ``s``) and turn the seeded initial
        weights into signed constants (idempotent) that get no gradient."""
        if self.settings["supsup_density"] == "erdos-renyi":
            shapes = [tuple(m.weight.shape) for m in supernet.layers.values()]
            self.er_scale = erdos_renyi_scale(shapes, self.k)
        for layer in supernet.layers.values():
            layer.weight.copy_(self.constants(layer.weight))
            layer.weight.requires_grad_(False)

    def begin_task(self, supernet: Supernet) -> None:
        super().begin_task(supernet)
        self.weight_budget = 0  # no weight is ever trained
        self.scores = {}
        weights = {n: m.weight for n, m in supernet.layers.items()}
        for name, head in self._heads(supernet).items():
            with torch.no_grad():
                head.weight.copy_(self.constants(head.weight))
                head.bias.zero_()
            weights[name] = head.weight
        for name, weight in weights.items():
            scores = torch.empty_like(weight)
            nn.init.kaiming_uniform_(scores, a=math.sqrt(5))
            self.scores[name] = nn.Parameter(scores)

    def forward(self, supernet: Supernet, x: Tensor) -> Tensor:
        tensors = {}
        for n, s in self.scores.items():
            mask = supermask(s, self.density_of(tuple(s.shape)))
            if n in supernet.layers:
                tensors[f"{n}.weight_mask"] = mask
            else:  # a masked head: its fixed signed constants under the supermask, no bias
                weight = supernet.task_modules[n].get_parameter("weight")
                tensors[f"{n}.weight"] = weight.detach() * mask
                tensors[f"{n}.bias"] = weight.new_zeros(weight.shape[0])
        return functional_call(supernet.model, tensors, (x,))

    @torch.no_grad()
    def prune_step(self, supernet: Supernet, progress: float) -> None:
        """Fix the task's supermasks (the top-k of its trained scores); a masked head keeps
        its masked signed constants."""
        masks = {n: supermask(s, self.density_of(tuple(s.shape))) for n, s in self.scores.items()}
        supernet.set_weight_masks({n: m.bool() for n, m in masks.items() if n in supernet.layers})
        for name, head in self._heads(supernet).items():
            head.weight.mul_(masks[name])
