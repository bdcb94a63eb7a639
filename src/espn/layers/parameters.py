"""Bare per-feature parameters of a model (a hand-written ViT's class token, a layer scale),
held per task by one :class:`TaskParameters` module, and the task tokens of espn's own ViT
(:class:`TaskTokens`); see docs/transformers.md."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from espn.layers.base import Cut, take
from espn.supernet.layers import TaskSpecific


def channel_axis(p: Tensor) -> int:
    """The dimension of bare parameter ``p`` that holds features: its last dimension of more
    than one element (a token's ``(1, 1, D)``, a layer scale's ``(C, 1, 1)``), as
    Torch-Pruning prunes such a parameter."""
    return max((i for i, n in enumerate(p.shape) if n != 1), default=p.dim() - 1)


def kept_features(p: Tensor, keep: Tensor | None) -> Tensor:
    """Bare parameter ``p`` at the features ``keep`` of its :func:`channel_axis` (None: all,
    ``p`` itself): the one cut of such a parameter, for the slim export and the ViT's step on
    its alive features alike."""
    index: list[Tensor | None] = [None] * p.dim()
    index[channel_axis(p)] = keep
    return take(p, Cut(tuple(index)))


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


class TaskTokens(TaskSpecific):
    """Prepends a class token and adds position embeddings, both owned by the active task (no
    task changes another's; no FLOPs). ``group``: the unit group of the ``dim`` features
    (the residual stream), whose pruned features the slim model drops from them."""

    def __init__(self, tokens: int, dim: int, group: str | None) -> None:
        super().__init__()
        self.group = group
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.reset_task(0)

    def reset_task(self, n_classes: int) -> None:
        with torch.no_grad():
            nn.init.trunc_normal_(self.cls_token, std=0.02)
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def forward(self, x: Tensor, alive: Tensor | None = None) -> Tensor:
        """The tokens of ``x`` (which holds the stream's features ``alive`` alone; None: all)."""
        cls = kept_features(self.cls_token, alive).expand(x.shape[0], -1, -1)
        return torch.cat([cls, x], dim=1) + kept_features(self.pos_embed, alive)
