"""``nn.LayerNorm`` over the last dimension: a task LayerNorm whose statistics run over the
alive features of its group (a pruned feature outputs exactly zero), exported as an
``nn.LayerNorm`` over the alive features (a token model with a pruned feature has no
full-width plain copy)."""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from espn.layers.base import (
    WHOLE,
    ConvertError,
    ExportError,
    Keep,
    LayerAdapter,
    Placement,
    alive_index,
    alive_keep,
    exporter,
    holding,
    register,
    take,
)
from espn.supernet.layers import UnitModule, expand_units


class TaskLayerNorm(nn.LayerNorm, UnitModule):
    """LayerNorm over the last dimension with per-task affine parameters (always affine) and
    statistics over the alive features of its group alone, as the slim model's ``nn.LayerNorm``
    computes them (docs/transformers.md); a pruned feature outputs exactly zero."""

    weight: nn.Parameter
    bias: nn.Parameter

    def __init__(self, n: int, group: str, eps: float = 1e-5, unit_size: int = 1) -> None:
        super().__init__(n, eps=eps)
        self._init_units(group, n, unit_size)
        self.affine = True

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            return self.masked_norm(x)
        alive = alive_index(self)
        if alive is None:
            return super().forward(x)
        if alive.numel() == 0:
            return self.masked_norm(x)  # every feature pruned: zeros
        # the alive features gathered, normalised as the slim model's LayerNorm does, and put
        # back at their places among zeros (a pruned feature outputs exactly zero)
        out = self.alive_norm(_Features.apply(x, alive, None), alive_keep(self))
        return cast(Tensor, _Features.apply(out, alive, x.shape[-1]))

    def alive_norm(self, x: Tensor, keep: Keep) -> Tensor:
        """The normalisation of ``x``, the features ``keep`` says a task keeps alone, at those
        features (its scale and shift at its adapter's cut): what :meth:`forward` computes
        there from the whole width."""
        cuts = exporter(self).cuts(self, keep)
        weight, bias = (take(getattr(self, k), cuts.get(k, WHOLE)) for k in ("weight", "bias"))
        return F.layer_norm(x, weight.shape, weight, bias, self.eps)

    def masked_norm(self, x: Tensor) -> Tensor:
        """The same normalisation written with the unit mask as a tensor (no Python value
        read from it): what a compiled graph computes, which a prune event's in-place mask
        update must not force to recompile."""
        mask = expand_units(self.unit_mask, self.unit_size).to(x.dtype)
        count = mask.sum().clamp_min(1.0)
        mean = (x * mask).sum(-1, keepdim=True) / count
        centred = (x - mean) * mask
        var = (centred * centred).sum(-1, keepdim=True) / count
        return centred * torch.rsqrt(var + self.eps) * (self.weight * mask) + self.bias * mask


class _Features(torch.autograd.Function):
    """The features ``index`` of the last dimension of ``x`` (``width`` None), or ``x``'s
    features put at places ``index`` of a last dimension of ``width`` among zeros; the
    backward is the other. A gather and a scatter: half the time of ``index_select``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, index: Tensor, width: int | None) -> Tensor:
        ctx.save_for_backward(index)
        ctx.width = x.shape[-1]
        return _move_features(x, index, width)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, None, None]:
        (index,) = ctx.saved_tensors
        (grad,) = grads
        back = ctx.width if grad.shape[-1] == index.numel() else None
        return _move_features(grad, index, back), None, None


def _move_features(x: Tensor, index: Tensor, width: int | None) -> Tensor:
    rows = x.reshape(-1, x.shape[-1])
    where = index.expand(rows.shape[0], -1)
    if width is None:
        return torch.gather(rows, 1, where).view(*x.shape[:-1], index.numel())
    out = rows.new_zeros(rows.shape[0], width).scatter_(1, where, rows)
    return out.view(*x.shape[:-1], width)


def channel_layer_norm(norm: nn.Module) -> nn.Sequential:
    """``norm`` over the channels of an NCHW map (timm's and torchvision's ``LayerNorm2d``):
    the map permuted to NHWC, ``norm`` over its last dimension, and permuted back, so that the
    converter sees a plain LayerNorm over features last."""
    from torchvision.ops.misc import Permute  # torchvision: only when converting

    return nn.Sequential(Permute([0, 2, 3, 1]), norm, Permute([0, 3, 1, 2]))


@register
class LayerNormAdapter(LayerAdapter):
    source = (nn.LayerNorm,)
    exports = (TaskLayerNorm,)
    role = "norm"
    tokens = True

    def check(self, name: str, m: nn.Module) -> None:
        assert isinstance(m, nn.LayerNorm)
        if len(m.normalized_shape) != 1:
            raise ConvertError(
                f"LayerNorm {name!r} normalises {tuple(m.normalized_shape)}; only a LayerNorm "
                "over the last dimension is supported"
            )

    def width(self, m: nn.Module, out_side: bool) -> int:
        assert isinstance(m, nn.LayerNorm)
        return int(m.normalized_shape[0])

    @torch.no_grad()
    def convert(self, m: nn.Module, place: Placement) -> nn.Module:
        """A task LayerNorm of its group starting from ``m``'s affine parameters (1 and 0 when
        ``m`` has none)."""
        assert isinstance(m, nn.LayerNorm)
        if place.norm_group is None:
            raise ConvertError(f"LayerNorm {place.name!r} does not follow any linear or conv layer")
        out = TaskLayerNorm(int(m.normalized_shape[0]), place.norm_group, m.eps, place.norm_unit)
        if m.weight is not None:
            out.weight.copy_(m.weight)
        if m.bias is not None:
            out.bias.copy_(m.bias)
        return out.to(device=out.weight.device if m.weight is None else m.weight.device)

    @torch.no_grad()
    def plain(self, m: nn.Module) -> nn.Module:
        assert isinstance(m, TaskLayerNorm)
        if not bool(m.unit_mask.all()):
            raise ExportError(
                "a transformer's sub-network has no full-width plain copy (its task LayerNorms "
                "normalise over alive features only); use slim_copy, which removes the dead ones"
            )
        return holding(nn.LayerNorm(len(m.weight), eps=m.eps), m.weight, m.bias)

    def resize(self, m: nn.Module) -> None:
        assert isinstance(m, TaskLayerNorm)
        m.normalized_shape = (len(m.weight),)
