"""Optimizers, learning-rate schedules, and the guard that keeps frozen weights exact."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from espn.methods.base import Phase
from espn.settings.training import OPTIONS, OptimConfig, OptimizerSettings
from espn.supernet.fast import LeanRMSprop, is_on
from espn.supernet.fast import float_bits as _bits
from espn.supernet.supernet import Supernet

#: ``nesterov``: SGD with Nesterov momentum (CPG's optimizer)
OPTIMIZERS = OPTIONS["optimizer"].choices


def build_optimizer(cfg: OptimizerSettings, params: list[Tensor]) -> torch.optim.Optimizer:
    """A fresh optimizer per task, so no state of an earlier task carries over; ``cfg``: the
    run's training settings, or a method's own optimizer (:class:`OptimConfig`). SGD and Adam
    use torch's fused kernels where every parameter allows (docs/performance.md, "Measuring").
    """
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params) or None
    if cfg.optimizer in ("sgd", "nesterov"):
        nesterov = cfg.optimizer == "nesterov"
        if nesterov and cfg.momentum <= 0:
            raise ValueError(f"optimizer 'nesterov' needs momentum > 0, got {cfg.momentum}")
        return torch.optim.SGD(
            params,
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            nesterov=nesterov,
            fused=fused,
        )
    if cfg.optimizer == "adam":
        return torch.optim.Adam(
            params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=fused
        )
    if cfg.optimizer == "rmsprop":
        rmsprop = LeanRMSprop if is_on() else torch.optim.RMSprop
        return rmsprop(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")


class TaskOptimizer:
    """The optimizers of one task: the weights' and, when the method trains its own
    parameters apart, theirs (``own``), stepped together.

    Its :meth:`state_dict` numbers the parameters of all of them in one sequence (the
    weights' first), so a checkpoint stores it as it would one optimizer's.
    """

    def __init__(
        self,
        weights: OptimizerSettings,
        params: Sequence[Tensor],
        own: OptimConfig | None = None,
        own_params: Sequence[Tensor] = (),
    ) -> None:
        params, own_params = list(params), list(own_params)
        if own is None:
            params, own_params = params + own_params, []
        #: None when nothing but the method's own parameters trains (SupSup's masked head)
        self.weights = build_optimizer(weights, params) if params else None
        self.own = build_optimizer(own, own_params) if own is not None and own_params else None
        self.settings, self.own_config = weights, own
        self.n_weights = len(params)

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The torch optimizers, the weights' first."""
        return [o for o in (self.weights, self.own) if o is not None]

    def set_lr(
        self, phase: Phase, epoch: int, n_epochs: int, step: int, n_iters: int, at: tuple[int, int]
    ) -> float:
        """Set the learning rate of step ``step`` of ``phase`` (see
        :class:`~espn.methods.base.Phase`), which runs ``n_epochs`` passes of ``n_iters``
        steps in all (see :func:`~espn.training.plan.plan_phase`), and return the weights'.
        The method's own parameters follow their schedule over the task's steps (``at``: done
        and in all), or the weights' rate scaled to theirs."""
        base = (self.settings.lr if phase.lr is None else phase.lr) * phase.lr_scale
        if phase.schedule == "cosine":
            lr = base * cosine_factor(step, n_iters)
        elif phase.schedule == "ramp":
            lr = base * (epoch + 1) / n_epochs
        elif phase.schedule == "step":
            lr = base * step_factor(step, n_iters)
        else:
            lr = base
        if self.weights is not None:
            for group in self.weights.param_groups:
                group["lr"] = lr
        own = self.own_config
        if self.own is not None and own is not None:
            if own.schedule == "cosine":
                own_lr = own.lr * cosine_factor(*at)
            else:
                own_lr = own.lr if own.schedule == "constant" else own.lr * lr / self.settings.lr
            for group in self.own.param_groups:
                group["lr"] = own_lr
        return lr

    @property
    def decays(self) -> bool:
        """Whether a step can move a weight whose gradient was always zero: only weight decay
        can (from zero gradients, every optimizer here keeps zero state and moves nothing)."""
        return any(g["weight_decay"] != 0 for o in self.optimizers for g in o.param_groups)

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[int, dict]:
        """Per-parameter state of every optimizer, numbered in one sequence."""
        state = {} if self.weights is None else dict(self.weights.state_dict()["state"])
        if self.own is not None:
            own = self.own.state_dict()["state"]
            state |= {self.n_weights + int(i): v for i, v in own.items()}
        return state

    def load_state_dict(self, state: dict[int, dict]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if self.weights is not None:
            mine = {int(i): v for i, v in state.items() if int(i) < self.n_weights}
            self.weights.load_state_dict(self.weights.state_dict() | {"state": mine})
        if self.own is not None:
            own = {int(i) - self.n_weights: v for i, v in state.items() if int(i) >= self.n_weights}
            self.own.load_state_dict(self.own.state_dict() | {"state": own})


def step_factor(step: int, total: int) -> float:
    """CPG's step decay: 1, then 0.1 after half of ``total`` steps, 0.01 after 80%."""
    return 0.1 ** ((step >= 0.5 * total) + (step >= 0.8 * total))


def cosine_factor(step: int, total: int) -> float:
    """Cosine decay from 1 to 0 over ``total`` steps."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(total, 1)))


class FrozenGuard:
    """Makes sure no optimizer moves a frozen weight, whatever its momentum or weight decay:
    zeroes their gradients before every step and, with ``restore`` (set when an optimizer
    decays), puts them back bit for bit after it (docs/algorithm.md, "Zero forgetting, exactly").
    """

    def __init__(self, supernet: Supernet, restore: bool = True) -> None:
        self.layers = [layer for layer in supernet.layers.values() if bool(layer.frozen.any())]
        self.keep, self.snapshot = [], []
        self.restores = restore
        for layer in self.layers:
            keep = layer.free_bits()
            self.keep.append(keep)
            if restore:
                self.snapshot.append(_bits(layer.weight.detach()) & ~keep)

    def begin_step(self) -> None:
        """Called before each backward pass: no gradient of an earlier one counts as kept."""
        for layer in self.layers:
            layer.forget_kept_grad()

    def mask_gradients(self) -> None:
        """Zero the gradient of every frozen weight (nothing to do on a layer whose masked
        product's backward zeroed them already, see ``MaskedLayer.grad_is_kept``)."""
        for layer, keep in zip(self.layers, self.keep, strict=True):
            if layer.weight.grad is not None and not layer.grad_is_kept():
                _bits(layer.weight.grad).bitwise_and_(keep)

    @torch.no_grad()
    def restore(self) -> None:
        """Put every frozen weight back to its snapshot, whatever the optimizer did (nothing
        to do without ``restore``: no optimizer moved them)."""
        if not self.restores:
            return
        for layer, keep, saved in zip(self.layers, self.keep, self.snapshot, strict=True):
            _bits(layer.weight).bitwise_and_(keep).bitwise_or_(saved)
