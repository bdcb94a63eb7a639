"""``nn.Conv2d``: masked shared weights whose output channels are units; grouped and
depthwise convs join the channels they read and write into one unit group whose unit is a
whole conv group. :class:`ConvAdapter` holds what every convolution shares (``conv1d`` uses it)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from espn.layers.base import (
    ConvertError,
    Placement,
    WeightAdapter,
    alive_inputs,
    alive_weight,
    holding,
    register,
)
from espn.supernet.layers import (
    MaskedConv2d,
    MaskedLayer,
    TaskHead,
    conv_padding,
    conv_pair,
)


class TaskConvHead(TaskHead):
    """A convolutional classifier owned by one task (SqueezeNet's and BiT's: a convolution to
    the classes, then global pooling): a :class:`TaskHead` whose weight is a 2-d convolution's
    ``(classes, channels, kh, kw)``, so that everything reading task heads reads it too."""

    def __init__(self, conv: nn.Conv2d, place: Placement) -> None:
        """The head of classifier ``conv`` (its settings, not its weights) placed at ``place``."""
        super().__init__(conv.in_channels, conv.out_channels, place.in_group, place.in_unit)
        self.kernel_size = conv_pair(conv.kernel_size)
        self.stride = conv_pair(conv.stride)
        self.padding = conv_padding(conv.padding)
        self.dilation = conv_pair(conv.dilation)
        self.weight = nn.Parameter(self.weight.new_empty(conv.weight.shape))
        self.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)


class ConvAdapter(WeightAdapter):
    """What convolutions of any dimension share: channels on dimension 1, groups."""

    may_scale = True
    #: the plain convolution exported
    plain_type: Callable[..., nn.Module] = nn.Conv2d

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

    @staticmethod
    def alive(m: MaskedLayer, units: dict[str, Tensor]) -> tuple[Tensor, int]:
        """The masked weight at the alive channels (:func:`alive_weight`) and the groups
        left: a grouped conv's units are whole groups, which keep all their inputs."""
        weight = alive_weight(m, units)
        groups = getattr(m, "groups", 1)
        return weight, 1 if groups == 1 else groups * weight.shape[0] // m.weight.shape[0]

    def _plain(self, m: nn.Module, c_in: int, c_out: int, groups: int, weight: Tensor) -> nn.Module:
        """A :attr:`plain_type` convolution with ``m``'s settings and ``weight``, no bias."""
        assert isinstance(m, nn.modules.conv._ConvNd)
        conv = self.plain_type(
            c_in,
            c_out,
            m.kernel_size,
            stride=m.stride,
            padding=m.padding,
            dilation=m.dilation,
            groups=groups,
            bias=False,
            padding_mode=m.padding_mode,
        )
        return holding(conv, weight)

    @torch.no_grad()
    def plain(self, m: nn.Module) -> nn.Module:
        assert isinstance(m, nn.modules.conv._ConvNd) and isinstance(m, MaskedLayer)
        return self._plain(m, m.in_channels, m.out_channels, m.groups, m.masked_weight())

    @torch.no_grad()
    def slim(self, m: nn.Module, units: dict[str, Tensor]) -> nn.Module:
        assert isinstance(m, MaskedLayer)
        weight, groups = self.alive(m, units)
        return self._plain(m, weight.shape[1] * groups, weight.shape[0], groups, weight)


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
        return TaskConvHead(m, place)

    @torch.no_grad()
    def plain(self, m: nn.Module) -> nn.Module:
        if isinstance(m, TaskConvHead):
            return self._head(m, m.weight)
        return super().plain(m)

    def _head(self, m: TaskConvHead, weight: Tensor) -> nn.Module:
        """The plain conv of head ``m`` with ``weight`` (its columns: the alive inputs)."""
        conv = nn.Conv2d(
            weight.shape[1], m.out_features, m.kernel_size, m.stride, m.padding, m.dilation
        )
        return holding(conv, weight, m.bias)

    @torch.no_grad()
    def slim(self, m: nn.Module, units: dict[str, Tensor]) -> nn.Module:
        if isinstance(m, TaskConvHead):
            return self._head(m, m.weight.index_select(1, alive_inputs(m, units)))
        return super().slim(m, units)
