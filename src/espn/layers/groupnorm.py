"""``nn.GroupNorm``: a task GroupNorm (per-task affine parameters) whose unit is a whole
number of its groups; the slim model keeps ``GroupNorm(alive groups, alive channels)``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from espn.layers.base import (
    ConvertError,
    LayerAdapter,
    Placement,
    alive_features,
    holding,
    register,
)
from espn.supernet.layers import TaskGroupNorm


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

    @torch.no_grad()
    def slim(self, m: nn.Module, units: dict[str, Tensor]) -> nn.Module:
        """A GroupNorm of the alive channels: whole groups, so as many groups fewer."""
        assert isinstance(m, TaskGroupNorm)
        keep = alive_features(units, m.group, m.unit_size, m.num_channels).to(m.weight.device)
        per_group = m.num_channels // m.num_groups
        gn = nn.GroupNorm(len(keep) // per_group, len(keep), eps=m.eps)
        return holding(gn, m.weight[keep], m.bias[keep])
