"""Optimizers, learning-rate schedules, and the guard that keeps frozen weights exact."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from espn.supernet.supernet import Supernet

OPTIMIZERS = ("sgd", "adam", "rmsprop")


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer settings; ``betas`` is Adam's, ``momentum`` SGD's and RMSprop's."""

    name: str = "rmsprop"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)


def build_optimizer(cfg: OptimConfig, params: list[Tensor]) -> torch.optim.Optimizer:
    """A fresh optimizer per task, so no state of an earlier task carries over."""
    if cfg.name == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    if cfg.name == "rmsprop":
        return torch.optim.RMSprop(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    raise ValueError(f"unknown optimizer {cfg.name!r}; choose one of: {', '.join(OPTIMIZERS)}")


def cosine_factor(step: int, total: int) -> float:
    """Cosine decay from 1 to 0 over ``total`` steps."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(total, 1)))


class FrozenGuard:
    """Makes sure no optimizer moves a frozen weight, whatever its momentum or weight decay.

    Gradients of frozen weights are zeroed before the step (so optimizer state never
    accumulates for them), and after the step the frozen entries are copied back from a
    snapshot taken when the task began (weight decay and momentum act even on zero gradients).
    """

    def __init__(self, supernet: Supernet) -> None:
        self.layers = [layer for layer in supernet.layers.values() if bool(layer.frozen.any())]
        self.snapshot = [layer.weight.detach().clone() for layer in self.layers]

    def mask_gradients(self) -> None:
        """Zero the gradient of every frozen weight."""
        for layer in self.layers:
            if layer.weight.grad is not None:
                layer.weight.grad.masked_fill_(layer.frozen, 0.0)

    @torch.no_grad()
    def restore(self) -> None:
        """Put every frozen weight back to its snapshot, whatever the optimizer did."""
        for layer, saved in zip(self.layers, self.snapshot, strict=True):
            layer.weight.copy_(torch.where(layer.frozen, saved, layer.weight))
