"""``nn.Linear``: masked shared weights whose output neurons are units; the model's last one
is the task head (one per task, or one shared masked head plus a per-task bias)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from espn.layers.base import Cut, Placement, WeightAdapter, holding, register
from espn.supernet.layers import MaskedLinear, TaskHead


@register
class LinearAdapter(WeightAdapter):
    source = (nn.Linear,)
    exports = (MaskedLinear, TaskHead)
    can_be_head = True
    reads_flattened = True
    token_outputs = True

    def width(self, m: nn.Module, out_side: bool) -> int:
        assert isinstance(m, nn.Linear)
        return m.out_features if out_side else m.in_features

    @torch.no_grad()
    def masked(self, m: nn.Module, place: Placement) -> nn.Module:
        assert isinstance(m, nn.Linear)
        out = MaskedLinear(
            m.in_features,
            m.out_features,
            in_units=place.in_group,
            out_units=place.out_group,
            in_unit_size=place.in_unit,
            out_unit_size=place.out_unit,
        )
        out.weight.copy_(m.weight)
        out.row_units = place.rows
        return out

    def per_task_head(self, m: nn.Module, place: Placement) -> TaskHead:
        assert isinstance(m, nn.Linear)
        return TaskHead(m.in_features, m.out_features, place.in_group, place.in_unit)

    @torch.no_grad()
    def plain(self, m: nn.Module) -> nn.Module:
        if isinstance(m, TaskHead):
            return holding(nn.Linear(m.in_features, m.out_features), m.weight, m.bias)
        assert isinstance(m, MaskedLinear)
        return holding(nn.Linear(m.in_features, m.out_features, bias=False), m.masked_weight())

    def slice(self, m: nn.Module, units: dict[str, Tensor]) -> dict[str, Cut]:
        cuts = super().slice(m, units)
        if isinstance(m, MaskedLinear):
            m.out_features, m.in_features = m.weight.shape
        return cuts
