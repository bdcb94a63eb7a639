"""``nn.GroupNorm``: a task GroupNorm (per-task affine parameters) whose unit is a whole
number of its groups; the slim model keeps ``GroupNorm(alive groups, alive channels)``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from espn.layers.base import (
    ConvertError,
    LayerAdapter,
    Placement,
    holding,
    register,
)
from espn.supernet.layers import UnitModule


class TaskGroupNorm(nn.GroupNorm, UnitModule):
    """GroupNorm whose affine parameters belong to the active task (always affine); a unit is
    ``unit_size`` consecutive channels, a whole number of its groups, so a pruned unit changes
    no other group's statistics (docs/architectures.md)."""

    weight: nn.Parameter
    bias: nn.Parameter

    def __init__(
        self, num_groups: int, num_channels: int, group: str, unit_size: int, eps: float = 1e-5
    ) -> None:
        super().__init__(num_groups, num_channels, eps=eps)
        if unit_size % (num_channels // num_groups):
            raise ValueError(
                f"a unit of {unit_size} channels is not a whole number of GroupNorm groups "
                f"({num_channels // num_groups} channels each)"
            )
        self._init_units(group, num_channels, unit_size)

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self.masked_affine()
        return F.group_norm(x, self.num_groups, weight, bias, self.eps)


@register
class GroupNormAdapter(LayerAdapter):
    source = (nn.GroupNorm,)
    exports = (TaskGroupNorm,)
    role = "norm"

    def width(self, m: nn.Module, out_side: bool) -> int:
        assert isinstance(m, nn.GroupNorm)
        return m.num_channels

    def group_count(self, name: str, m: nn.Module) -> tuple[str, int] | None:
        assert isinstance(m, nn.GroupNorm)
        plural = "s" if m.num_groups != 1 else ""
        return f"GroupNorm {name!r} ({m.num_groups} group{plural})", m.num_groups

    @torch.no_grad()
    def convert(self, m: nn.Module, place: Placement) -> nn.Module:
        """A task GroupNorm holding ``m``'s affine parameters (1 and 0 without)."""
        assert isinstance(m, nn.GroupNorm)
        if place.norm_group is None:
            raise ConvertError(f"GroupNorm {place.name!r} does not follow any conv layer")
        norm = TaskGroupNorm(
            m.num_groups, m.num_channels, place.norm_group, place.norm_unit, eps=m.eps
        )
        if m.affine:
            norm.weight.copy_(m.weight)
            norm.bias.copy_(m.bias)
        return norm

    @torch.no_grad()
    def plain(self, m: nn.Module) -> nn.Module:
        assert isinstance(m, TaskGroupNorm)
        gn = nn.GroupNorm(m.num_groups, m.num_channels, eps=m.eps)
        return holding(gn, m.weight * m.entry_mask(), m.bias * m.entry_mask())

    def resize(self, m: nn.Module) -> None:
        """The alive channels: whole groups, so as many groups fewer."""
        assert isinstance(m, TaskGroupNorm)
        per_group = m.num_channels // m.num_groups
        m.num_channels = len(m.weight)
        m.num_groups = m.num_channels // per_group
