"""``nn.Conv2d``: masked shared weights whose output channels are units; grouped and
depthwise convs join the channels they read and write into one unit group whose unit is a
whole conv group. :class:`ConvAdapter` holds what every convolution shares (``conv1d`` uses it)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from espn.layers.base import (
    ConvertError,
    ExportError,
    Placement,
    WeightAdapter,
    alive_features,
    param,
    register,
)
from espn.supernet.layers import (
    MaskedConv2d,
    TaskConvHead,
    TaskHead,
    conv_padding,
    conv_pair,
)


class ConvAdapter(WeightAdapter):
    """What convolutions of any dimension share: channels on dimension 1, groups."""

    may_scale = True

    def check(self, name: str, m: nn.Module) -> None:
        assert isinstance(m, nn.modules.conv._ConvNd)
        if 1 != m.groups == m.out_channels != m.in_channels:
            raise ConvertError(
                f"conv {name!r} has one output channel per group (groups={m.groups}, "
                f"{m.in_channels} in and {m.out_channels} out channels), which Torch-Pruning "
                "takes for a depthwise conv; supported: grouped convs with 2 or more output "
                "channels per group, and depthwise convs (groups = in = out channels)"
            )

    def width(self, m: nn.Module, out_side: bool) -> int:
        assert isinstance(m, nn.modules.conv._ConvNd)
        return m.out_channels if out_side else m.in_channels

    def groups(self, m: nn.Module) -> int:
        assert isinstance(m, nn.modules.conv._ConvNd)
        return m.groups

    def depthwise(self, m: nn.Module) -> bool:
        assert isinstance(m, nn.modules.conv._ConvNd)
        return m.groups != 1 and m.groups == m.in_channels == m.out_channels

    def group_count(self, name: str, m: nn.Module) -> tuple[str, int] | None:
        groups = self.groups(m)
        return (f"conv {name!r} (groups={groups})", groups) if groups != 1 else None

    def out_pruner(self) -> Callable[..., object]:
        import torch_pruning as tp  # heavy (it imports timm and wandb): only when slimming

        return tp.prune_conv_out_channels

    def hold_groups(self, m: nn.Module, out_units: Tensor | None) -> Callable[[], None] | None:
        """A grouped conv (not depthwise: Torch-Pruning slims those) is left ungrouped with a
        stand-in weight of zeros (one stored value, expanded) that Torch-Pruning may cut on
        both sides as it would an ungrouped conv's; its cut on the input side of a grouped
        conv assumes every group loses the same channels and would index past the weight.
        The real weight at the alive output channels (all of their inputs: a whole group
        lives or dies) comes back afterwards with ``groups`` = alive groups."""
        assert isinstance(m, nn.modules.conv._ConvNd)
        if m.groups in (1, m.out_channels):
            return None
        assert out_units is not None  # a grouped conv's channels are its out_units
        rows = out_units.to(m.weight.device)
        alive_groups = m.groups * int(rows.sum()) // m.out_channels
        weight = m.weight.detach()[rows].clone()
        stand_in = m.weight.new_zeros(()).expand(m.out_channels, m.in_channels, *m.kernel_size)
        m.weight, m.groups = nn.Parameter(stand_in), 1

        def regroup() -> None:
            m.weight = param(weight)
            m.groups = alive_groups
            m.in_channels = alive_groups * weight.shape[1]

        return regroup


@register
class Conv2dAdapter(ConvAdapter):
    source = (nn.Conv2d,)
    exports = (MaskedConv2d, TaskConvHead)
    can_be_head = True

    @torch.no_grad()
    def masked(self, m: nn.Module, place: Placement) -> nn.Module:
        assert isinstance(m, nn.Conv2d)
        grouped = m.groups != 1  # its input groups are its output units
        out = MaskedConv2d(
            m.in_channels,
            m.out_channels,
            m.kernel_size,
            stride=m.stride,
            padding=m.padding,
            in_units=None if grouped else place.in_group,
            out_units=place.out_group,
            dilation=m.dilation,
            padding_mode=m.padding_mode,
            groups=m.groups,
            in_unit_size=1 if grouped else place.in_unit,
            out_unit_size=place.out_unit,
        )
        out.weight.copy_(m.weight)
        return out

    def per_task_head(self, m: nn.Module, place: Placement) -> TaskHead:
        """SqueezeNet's and BiT's classifier, a conv to the classes: a :class:`TaskConvHead`."""
        assert isinstance(m, nn.Conv2d)
        return TaskConvHead(
            m.in_channels,
            m.out_channels,
            conv_pair(m.kernel_size),
            conv_pair(m.stride),
            conv_padding(m.padding),
            conv_pair(m.dilation),
            place.in_group,
            place.in_unit,
        )

    @staticmethod
    def _empty(m: MaskedConv2d, c_in: int, c_out: int, groups: int) -> nn.Conv2d:
        return nn.Conv2d(
            c_in,
            c_out,
            conv_pair(m.kernel_size),
            stride=conv_pair(m.stride),
            padding=conv_padding(m.padding),
            dilation=conv_pair(m.dilation),
            groups=groups,
            bias=False,
            padding_mode=m.padding_mode,
        )

    @torch.no_grad()
    def plain(self, m: nn.Module) -> nn.Module:
        if isinstance(m, TaskConvHead):
            return self._head(m, m.weight)
        assert isinstance(m, MaskedConv2d)
        conv = self._empty(m, m.in_channels, m.out_channels, m.groups)
        conv.weight = param(m.masked_weight())
        return conv.to(device=m.weight.device, dtype=m.weight.dtype)

    def _head(self, m: TaskConvHead, weight: Tensor) -> nn.Conv2d:
        """The plain conv of head ``m`` with ``weight`` (its columns: the alive inputs)."""
        conv = nn.Conv2d(
            weight.shape[1], m.out_features, m.kernel_size, m.stride, m.padding, m.dilation
        )
        conv.weight, conv.bias = param(weight), param(m.bias)
        return conv.to(device=weight.device, dtype=weight.dtype)

    @torch.no_grad()
    def slim(self, m: nn.Module, units: dict[str, Tensor]) -> nn.Module:
        if isinstance(m, TaskConvHead):
            w = m.weight
            cols = alive_features(units, m.in_units, m.in_unit_size, w.shape[1]).to(w.device)
            return self._head(m, w.index_select(1, cols))
        assert isinstance(m, MaskedConv2d)
        if m.groups != 1:
            raise ExportError(f"grouped convolution ({m.groups} groups) in a token model")
        w = m.weight
        rows = alive_features(units, m.out_units, m.out_unit_size, w.shape[0]).to(w.device)
        cols = alive_features(units, m.in_units, m.in_unit_size, w.shape[1]).to(w.device)
        conv = self._empty(m, len(cols), len(rows), 1)
        conv.weight = param(m.masked_weight().index_select(0, rows).index_select(1, cols))
        return conv.to(device=w.device, dtype=w.dtype)
