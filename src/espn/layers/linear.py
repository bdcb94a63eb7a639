"""``nn.Linear``: masked shared weights whose output neurons are units; the model's last one
is the task head (one per task, or one shared masked head plus a per-task bias)."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from espn.layers.base import (
    WHOLE,
    Cut,
    Keep,
    Placement,
    TokenGate,
    WeightAdapter,
    exporter,
    holding,
    hooked,
    register,
    take,
)
from espn.supernet.fast import is_on
from espn.supernet.layers import MaskedLayer, TaskBias, TaskHead


class MaskedLinear(nn.Linear, MaskedLayer):
    """``nn.Linear`` without bias whose weight is multiplied by the active task's mask; unit
    ``c`` of ``in_units`` owns the ``k = in_unit_size`` inputs ``c*k ... (c+1)*k - 1`` (a
    ``(C, H, W)`` feature map flattened, ``k = H*W``)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        in_units: str | None = None,
        out_units: str | None = None,
        in_unit_size: int = 1,
        out_unit_size: int = 1,
    ) -> None:
        super().__init__(in_features, out_features, bias=False)
        self._init_masks(in_units, out_units, in_unit_size, out_unit_size)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.masked_weight())


def model_head(
    in_features: int, n_classes: int, in_units: str | None, multi_head: bool, task_bias: bool
) -> nn.Module:
    """A :class:`TaskHead` per task with ``multi_head``, else a head shared by every task and
    masked like the other layers; with ``task_bias`` (beyond the paper) each task adds its
    own output bias."""
    if multi_head:
        return TaskHead(in_features, n_classes, in_units)
    head = MaskedLinear(in_features, n_classes, in_units=in_units)
    return nn.Sequential(head, TaskBias(n_classes)) if task_bias else nn.Sequential(head)


def gated(layer: nn.Module, gate: nn.Module, x: Tensor) -> Tensor:
    """``gate(layer(x))``; on the fast path, in a training step of a masked linear layer and a
    token gate, one linear map whose weight rows the gate scales (its shift the bias), as the
    slim export folds it: a pass over the weights instead of several over every token. Not
    where anything could tell: traced, hooked, or a gate that is the identity."""
    if (
        is_on()
        and not is_fx_symbolic_tracing()
        and isinstance(layer, MaskedLinear)
        and isinstance(gate, TokenGate)
        and layer.training
        and torch.is_grad_enabled()
        and not hooked(layer)
        and not hooked(gate)
        and not gate.is_identity()
    ):
        return alive_linear(layer, x, None, gate)
    return cast(Tensor, gate(layer(x)))


def alive_linear(
    layer: MaskedLinear, x: Tensor, keep: Keep | None = None, gate: TokenGate | None = None
) -> Tensor:
    """``layer``'s map on the features ``keep`` says a task keeps (``x`` holds just its kept
    inputs; None: all), ``gate`` folded into its rows (see :func:`gated`): its masked weight,
    the tensor its forward reads (the gradient flows as there), at its adapter's cut."""
    cut = WHOLE if keep is None else exporter(layer).cuts(layer, keep)["weight"]
    weight = take(layer.masked_weight(), cut)
    if gate is None or gate.is_identity():
        return F.linear(x, weight)
    rows = Cut(cut.index[:1])
    scale, shift = gate.feature_affine()
    shift = None if shift is None else take(shift, rows)
    return F.linear(x, weight * take(scale, rows).unsqueeze(1), shift)


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
