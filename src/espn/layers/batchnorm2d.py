"""``nn.BatchNorm2d``: a task BatchNorm (:class:`BatchNormAdapter`, shared with ``batchnorm1d``);
over concatenated maps a :class:`SplitNorm`. See docs/architectures.md, "Layers"."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from espn.layers.base import (
    ConvertError,
    LayerAdapter,
    Placement,
    holding,
    param,
    register,
)
from espn.supernet.layers import UnitModule

#: while it holds a function, training task BatchNorms call it instead (``(norm, x, weight,
#: bias) -> output``; it keeps the running statistics): a sharded training step's (see
#: :func:`espn.training.distributed.sharded_step`)
SHARD_BATCH_NORM: list[Callable[..., Tensor]] = []


class TaskBatchNorm(nn.modules.batchnorm._BatchNorm, UnitModule):
    """BatchNorm (always affine, with running statistics) whose parameters and statistics
    belong to the active task; a unit spans ``unit_size`` features (channels of a grouped
    conv). A subclass names the torch BatchNorm class of its dimension too."""

    weight: nn.Parameter
    bias: nn.Parameter
    running_mean: Tensor
    running_var: Tensor
    num_batches_tracked: Tensor

    def __init__(self, n: int, group: str, unit_size: int = 1) -> None:
        super().__init__(n)
        self._init_units(group, n, unit_size)

    def forward(self, x: Tensor) -> Tensor:
        """Batch statistics while training, the task's running statistics otherwise; scale
        and shift masked by the task's units."""
        weight, bias = self.masked_affine()
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training:
            if SHARD_BATCH_NORM:
                return SHARD_BATCH_NORM[-1](self, x, weight, bias)
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average, as torch's BatchNorm
                factor = 1.0 / float(self.num_batches_tracked)
        return F.batch_norm(
            x, self.running_mean, self.running_var, weight, bias, self.training, factor, self.eps
        )


class TaskBatchNorm2d(TaskBatchNorm, nn.BatchNorm2d):
    """A task BatchNorm over the channels of ``(N, C, H, W)``."""


class SplitNorm(nn.Module):
    """A per-channel norm over concatenated feature maps as one norm per member, each of its
    member's unit group (``parts``, in the concatenation's order): it computes what the one
    norm computes, and each member's channels are pruned with their group. Each part's width
    is read at every call, so that a slim copy of the parts needs no other change."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: Tensor) -> Tensor:
        widths = [len(p.get_parameter("weight")) for p in self.parts]
        return torch.cat([p(c) for p, c in zip(self.parts, x.split(widths, 1), strict=True)], 1)

    @torch.no_grad()
    def joined(self) -> nn.Module:
        """One norm computing what the parts compute, once they are plain torch BatchNorms
        (an export's: one op, not a split, a norm per part and a concatenation)."""
        norm = cast(nn.modules.batchnorm._BatchNorm, copy.deepcopy(self.parts[0]))
        for key, value in [
            *norm.named_parameters(recurse=False),
            *norm.named_buffers(recurse=False),
        ]:
            if value.dim():
                whole = torch.cat([getattr(p, key) for p in self.parts])
                setattr(norm, key, param(whole) if isinstance(value, nn.Parameter) else whole)
        norm.num_features = len(norm.weight)
        return norm


class BatchNormAdapter(LayerAdapter):
    """A BatchNorm of any dimension: ``task_type`` in the supernet, ``plain_type`` exported."""

    role = "norm"
    absorbs_bias = True
    per_channel = True
    task_type: Any = TaskBatchNorm2d
    plain_type: type[nn.modules.batchnorm._BatchNorm] = nn.BatchNorm2d
    #: plain layer types it folds into on export (their outputs' channels on dimension 1)
    folds_into: tuple[type[nn.Module], ...] = (nn.Conv2d,)

    def check(self, name: str, m: nn.Module) -> None:
        assert isinstance(m, nn.modules.batchnorm._BatchNorm)
        if not m.affine:
            raise ConvertError(f"BatchNorm {name!r} has affine=False; its gamma is the saliency")

    def width(self, m: nn.Module, out_side: bool) -> int:
        assert isinstance(m, nn.modules.batchnorm._BatchNorm)
        return m.num_features

    @torch.no_grad()
    def convert(self, m: nn.Module, place: Placement) -> nn.Module:
        assert isinstance(m, nn.modules.batchnorm._BatchNorm)
        if place.norm_group is None:
            raise ConvertError(f"BatchNorm {place.name!r} does not follow any conv layer")
        if not place.concat:
            return self._task_norm(m, place.norm_group, place.norm_unit, 0, m.num_features)
        ends = list(itertools.accumulate(width for _, width in place.concat))
        starts = [0, *ends[:-1]]
        return SplitNorm(
            [
                self._task_norm(m, group, place.norm_unit, start, end)
                for (group, _), start, end in zip(place.concat, starts, ends, strict=True)
            ]
        )

    def _task_norm(
        self, m: nn.modules.batchnorm._BatchNorm, group: str, unit: int, start: int, end: int
    ) -> nn.Module:
        """The task BatchNorm of unit group ``group`` holding channels ``start:end`` of ``m``."""
        bn = self.task_type(end - start, group, unit)
        bn.eps, bn.momentum = m.eps, m.momentum
        state = {k: v[start:end] if v.dim() else v for k, v in m.state_dict().items()}
        bn.load_state_dict(state, strict=False)
        return bn

    @torch.no_grad()
    def plain(self, m: nn.Module) -> nn.Module:
        assert isinstance(m, TaskBatchNorm)
        mask = m.entry_mask()
        bn = self.plain_type(len(m.weight), eps=m.eps, momentum=m.momentum)
        bn.running_mean = m.running_mean.detach().clone()
        bn.running_var = m.running_var.detach().clone()
        bn.num_batches_tracked = m.num_batches_tracked.detach().clone()
        return holding(bn, m.weight * mask, m.bias * mask)

    def resize(self, m: nn.Module) -> None:
        assert isinstance(m, TaskBatchNorm)
        m.num_features = len(m.weight)

    @torch.no_grad()
    def fold_norm(self, layer: nn.Module, norm: nn.Module) -> nn.Module | None:
        """``layer`` with ``norm`` folded in, the products taken in float64 and rounded once to
        the layer's dtype."""
        if not isinstance(layer, self.folds_into):
            return None
        weight = layer.weight
        assert isinstance(weight, Tensor)
        dtype = weight.dtype
        wide = copy.deepcopy(layer).double().eval()
        return self._fuse(wide, copy.deepcopy(norm).double().eval()).to(dtype)

    def _fuse(self, layer: nn.Module, norm: nn.Module) -> nn.Module:
        assert isinstance(layer, nn.modules.conv._ConvNd)
        assert isinstance(norm, nn.modules.batchnorm._BatchNorm)
        return fuse_conv_bn_eval(layer, norm)


@register
class BatchNorm2dAdapter(BatchNormAdapter):
    source = (nn.BatchNorm2d,)
    exports = (TaskBatchNorm2d,)
