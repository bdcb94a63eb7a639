"""``nn.Conv1d`` (audio, time series): masked shared weights whose output channels are units,
grouped and depthwise as :mod:`espn.layers.conv2d` (one output position per step of the
sequence in the FLOP count)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from espn.layers.base import Placement, register
from espn.layers.conv2d import ConvAdapter
from espn.supernet.layers import MaskedLayer


class MaskedConv1d(nn.Conv1d, MaskedLayer):
    """``nn.Conv1d`` without bias whose weight is multiplied by the active task's mask; a
    grouped one names its channels by ``out_units`` alone (see
    :class:`~espn.layers.conv2d.MaskedConv2d`)."""

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
            conv.kernel_size[0],  # nn.Conv1d stores 1-tuples
            stride=conv.stride[0],
            padding=conv.padding if isinstance(conv.padding, str) else conv.padding[0],
            dilation=conv.dilation[0],
            groups=conv.groups,
            bias=False,
            padding_mode=conv.padding_mode,
        )
        self._init_masks(in_units, out_units, in_unit_size, out_unit_size)

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, self.masked_weight(), None)


@register
class Conv1dAdapter(ConvAdapter):
    source = (nn.Conv1d,)
    exports = (MaskedConv1d,)
    plain_type = nn.Conv1d

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
