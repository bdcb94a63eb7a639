"""``nn.Conv1d`` (audio, time series): masked shared weights whose output channels are units,
grouped and depthwise as :mod:`espn.layers.conv2d` (one output position per step of the
sequence in the FLOP count)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from espn.layers.base import Placement, param, register
from espn.layers.conv2d import ConvAdapter
from espn.supernet.layers import MaskedLayer


def _one(value: int | tuple[int, ...]) -> int:
    """A 1-D convolution's size argument (``nn.Conv1d`` stores a 1-tuple)."""
    return value if isinstance(value, int) else int(value[0])


def _padding(value: str | int | tuple[int, ...]) -> str | int:
    return value if isinstance(value, str) else _one(value)


class MaskedConv1d(nn.Conv1d, MaskedLayer):
    """``nn.Conv1d`` without bias whose weight is multiplied by the active task's mask; a
    grouped one names its channels by ``out_units`` alone (see
    :class:`~espn.supernet.layers.MaskedConv2d`)."""

    def __init__(
        self,
        conv: nn.Conv1d,
        in_units: str | None,
        out_units: str | None,
        in_unit_size: int = 1,
        out_unit_size: int = 1,
    ) -> None:
        if conv.groups != 1 and in_units is not None:
            raise ValueError("a grouped conv's channels are its out_units; in_units must be None")
        super().__init__(
            conv.in_channels,
            conv.out_channels,
            _one(conv.kernel_size),
            stride=_one(conv.stride),
            padding=_padding(conv.padding),
            dilation=_one(conv.dilation),
            groups=conv.groups,
            bias=False,
            padding_mode=conv.padding_mode,
        )
        self._init_masks(in_units, out_units)
        self.in_unit_size = in_unit_size
        self.out_unit_size = out_unit_size

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, self.masked_weight(), None)


def _plain(m: MaskedConv1d, c_in: int, c_out: int, groups: int, weight: Tensor) -> nn.Conv1d:
    conv = nn.Conv1d(
        c_in,
        c_out,
        _one(m.kernel_size),
        stride=_one(m.stride),
        padding=_padding(m.padding),
        dilation=_one(m.dilation),
        groups=groups,
        bias=False,
        padding_mode=m.padding_mode,
    )
    conv.weight = param(weight)
    return conv.to(device=weight.device, dtype=weight.dtype)


@register
class Conv1dAdapter(ConvAdapter):
    source = (nn.Conv1d,)
    exports = (MaskedConv1d,)

    @torch.no_grad()
    def masked(self, m: nn.Module, place: Placement) -> nn.Module:
        assert isinstance(m, nn.Conv1d)
        grouped = m.groups != 1  # its input groups are its output units
        out = MaskedConv1d(
            m,
            None if grouped else place.in_group,
            place.out_group,
            1 if grouped else place.in_unit,
            place.out_unit,
        )
        out.weight.copy_(m.weight)
        return out

    @torch.no_grad()
    def plain(self, m: nn.Module) -> nn.Module:
        assert isinstance(m, MaskedConv1d)
        return _plain(m, m.in_channels, m.out_channels, m.groups, m.masked_weight())

    @torch.no_grad()
    def slim(self, m: nn.Module, units: dict[str, Tensor]) -> nn.Module:
        assert isinstance(m, MaskedConv1d)
        weight, groups = self.alive(m, units)
        return _plain(m, weight.shape[1] * groups, weight.shape[0], groups, weight)
