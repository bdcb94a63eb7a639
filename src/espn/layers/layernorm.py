"""``nn.LayerNorm`` over the last dimension: a task LayerNorm whose statistics run over the
alive features of its group (a pruned feature outputs exactly zero), exported as an
``nn.LayerNorm`` over the alive features (a token model with a pruned feature has no
full-width plain copy)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from espn.layers.base import (
    ConvertError,
    Cut,
    ExportError,
    LayerAdapter,
    Placement,
    cut_units,
    holding,
    register,
)
from espn.supernet.transformer import TaskLayerNorm


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

    def slice(self, m: nn.Module, units: dict[str, Tensor]) -> dict[str, Cut]:
        assert isinstance(m, TaskLayerNorm)
        cuts = cut_units(m, units)
        m.normalized_shape = (len(m.weight),)
        return cuts
