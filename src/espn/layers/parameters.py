"""Bare per-feature parameters of a model (a hand-written ViT's class token, a layer scale),
held per task by one :class:`TaskParameters` module; see docs/transformers.md."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from espn.supernet.layers import TaskSpecific


def channel_axis(p: Tensor) -> int:
    """The dimension of bare parameter ``p`` that holds features: its last dimension of more
    than one element (a token's ``(1, 1, D)``, a layer scale's ``(C, 1, 1)``), as
    Torch-Pruning prunes such a parameter."""
    return max((i for i, n in enumerate(p.shape) if n != 1), default=p.dim() - 1)


class TaskParameters(TaskSpecific):
    """Per-task values of bare parameters of a model, each owned by the unit group of its
    :func:`channel_axis` (``groups``; None: not pruned), the same ``nn.Parameter`` objects the
    model reads, under ``p0, p1, ...``; ``targets`` are their names in the model."""

    def __init__(self, params: dict[str, nn.Parameter], groups: list[str | None]) -> None:
        super().__init__()
        self.targets = list(params)
        self.groups = groups
        for i, p in enumerate(params.values()):
            self.register_parameter(f"p{i}", p)
            # not task state: the values every new task starts from (the model's own)
            self.register_buffer(f"initial{i}", p.detach().clone(), persistent=False)

    def reset_task(self, n_classes: int) -> None:
        """A new task starts from the values the model was converted with (after
        ``espn.load``, those of the model given to it)."""
        with torch.no_grad():
            for i in range(len(self.targets)):
                getattr(self, f"p{i}").copy_(getattr(self, f"initial{i}"))

    @torch.no_grad()
    def zero_dead(self, alive: dict[str, Tensor]) -> None:
        """A dead feature's values are zero: it is then exactly zero wherever the parameter
        is added or concatenated (a class token read by a head that does not mask its
        inputs), as the slim model, which drops it, computes."""
        for i, group in enumerate(self.groups):
            p = getattr(self, f"p{i}")
            if group in alive:
                shape = [1] * p.dim()
                shape[channel_axis(p)] = -1
                p.mul_(alive[group].to(p).view(shape))

    def forward(self, x: Tensor) -> Tensor:
        raise RuntimeError("TaskParameters holds parameters the model reads; it is not called")
