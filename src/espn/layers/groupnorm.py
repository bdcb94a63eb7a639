"""``nn.GroupNorm``: a task GroupNorm (per-task affine parameters) whose unit is a whole
number of its groups; the slim model keeps ``GroupNorm(alive groups, alive channels)``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from espn.layers.base import ConvertError, LayerAdapter, Placement, param, register
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
        gn.weight, gn.bias = param(m.weight * m.entry_mask()), param(m.bias * m.entry_mask())
        return gn.to(device=m.weight.device, dtype=m.weight.dtype)

    def hold_groups(self, m: nn.Module, out_units: Tensor | None) -> Callable[[], None] | None:
        """Torch-Pruning keeps a GroupNorm's group count; whole groups were removed, so the
        count shrinks with the channels."""
        assert isinstance(m, nn.GroupNorm)
        per_group = m.num_channels // m.num_groups

        def regroup() -> None:
            m.num_groups = m.num_channels // per_group

        return regroup
