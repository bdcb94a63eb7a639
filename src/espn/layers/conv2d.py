"""``nn.Conv2d``: masked shared weights whose output channels are units; grouped and
depthwise convs join the channels they read and write into one unit group whose unit is a
whole conv group. :class:`ConvAdapter` holds what every convolution shares (``conv1d`` uses it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from espn.layers.base import (
    ConvertError,
    Placement,
    WeightAdapter,
    holding,
    register,
)
from espn.supernet.layers import MaskedLayer, TaskHead

#: how ``nn.Conv2d`` pads
PaddingMode = Literal["zeros", "reflect", "replicate", "circular"]


def conv_pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    """A 2-D convolution's size argument (kernel size, stride, dilation) as a pair; accepts
    the ``tuple[int, ...]`` that ``nn.Conv2d`` stores."""
    if isinstance(value, int):
        return value, value
    height, width = value
    return height, width


def conv_padding(value: str | int | tuple[int, ...]) -> str | tuple[int, int]:
    """A 2-D convolution's padding: a mode name (``"same"``) or a pair."""
    return value if isinstance(value, str) else conv_pair(value)


class MaskedConv2d(nn.Conv2d, MaskedLayer):
    """``nn.Conv2d`` without bias whose weight is multiplied by the active task's mask. A
    grouped convolution's input and output channels are one unit group, ``out_units``, whose
    unit is a whole number of conv groups (docs/architectures.md, "How units are formed")."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] | str = 0,
        in_units: str | None = None,
        out_units: str | None = None,
        dilation: int | tuple[int, ...] = 1,
        padding_mode: PaddingMode = "zeros",
        groups: int = 1,
        in_unit_size: int = 1,
        out_unit_size: int = 1,
    ) -> None:
        if groups != 1 and in_units is not None:
            raise ValueError("a grouped conv's channels are its out_units; in_units must be None")
        if groups != 1 and groups % max(out_channels // out_unit_size, 1):
            raise ValueError(
                f"grouped conv with groups={groups}: a unit of {out_unit_size} of its "
                f"{out_channels} output channels is not a whole number of groups"
            )
        super().__init__(
            in_channels,
            out_channels,
            conv_pair(kernel_size),
            stride=conv_pair(stride),
            padding=conv_padding(padding),
            dilation=conv_pair(dilation),
            groups=groups,
            bias=False,
            padding_mode=padding_mode,
        )
        self._init_masks(in_units, out_units, in_unit_size, out_unit_size)

    @property
    def grouped(self) -> bool:
        """Whether input groups map to output groups alone (``groups`` > 1, depthwise too)."""
        return self.groups != 1

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, self.masked_weight(), None)


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

    @torch.no_grad()
    def plain(self, m: nn.Module) -> nn.Module:
        assert isinstance(m, nn.modules.conv._ConvNd) and isinstance(m, MaskedLayer)
        conv = self.plain_type(
            m.in_channels,
            m.out_channels,
            m.kernel_size,
            stride=m.stride,
            padding=m.padding,
            dilation=m.dilation,
            groups=m.groups,
            bias=False,
            padding_mode=m.padding_mode,
        )
        return holding(conv, m.masked_weight())

    def resize(self, m: nn.Module) -> None:
        """A grouped conv's units are whole groups, which keep all their inputs: as many
        groups fewer."""
        if isinstance(m, nn.modules.conv._ConvNd):
            if m.groups != 1:
                m.groups = m.groups * m.weight.shape[0] // m.out_channels
            m.out_channels, m.in_channels = m.weight.shape[0], m.weight.shape[1] * m.groups


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
            conv = nn.Conv2d(
                m.in_features, m.out_features, m.kernel_size, m.stride, m.padding, m.dilation
            )
            return holding(conv, m.weight, m.bias)
        return super().plain(m)
