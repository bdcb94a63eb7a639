"""Slim export of transformer supernets (token tensors, attention heads, LayerNorm).

Torch-Pruning's dependency graph follows channels through convolutions and residual adds,
but not through a class token concatenated along the token axis, position embeddings held
as bare parameters, or heads reshaped out of q, k and v. A transformer supernet already
names the alive features of every layer (its unit groups, heads spanning ``head_dim``
features), and its traced graph reads the head count from the tensors, so the slim model is
built directly: each masked layer becomes an ``nn.Linear`` / ``nn.Conv2d`` holding only the
rows and columns of alive features, each task LayerNorm an ``nn.LayerNorm`` over the alive
features, gates are folded into the layer before them, and the task's class token and
position embeddings are kept at their alive features. No espn class is left.
"""

from __future__ import annotations

import torch
from torch import Tensor, fx, nn

from espn.layers.base import alive_features, param
from espn.layers.parameters import TaskParameters, channel_axis
from espn.supernet.layers import MaskedLayer, TaskSpecific
from espn.supernet.supernet import Supernet
from espn.supernet.transformer import MaskedAttention, TaskLayerNorm, TaskTokens, TokenGate

#: modules that make a supernet take this export path
TOKEN_MODULES = (TaskLayerNorm, TaskTokens, TokenGate, MaskedAttention)


def uses_tokens(supernet: Supernet) -> bool:
    """Whether ``supernet`` holds transformer modules (and is cut by :class:`TokenTracer` and
    :func:`slim_tokens`)."""
    return any(isinstance(m, TOKEN_MODULES) for m in supernet.model.modules())


class TokenTracer(fx.Tracer):
    """Keeps masked and task modules as leaves, except task tokens, whose parameters are read
    directly (``get_attr``) so that the graph needs no espn class."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, TaskTokens):
            return False
        return isinstance(m, MaskedLayer | TaskSpecific) or super().is_leaf_module(
            m, module_qualified_name
        )


@torch.no_grad()
def slim_tokens(gm: fx.GraphModule, model: nn.Module, units: dict[str, Tensor]) -> None:
    """Cut every class token / position embedding parameter to its alive stream features."""
    for m in model.modules():
        if isinstance(m, TaskParameters):
            for target, group in zip(m.targets, m.groups, strict=True):
                _cut_last(gm, target, units, group)
    for name, m in model.named_modules():
        if not isinstance(m, TaskTokens):
            continue
        for attr in ("cls_token", "pos_embed"):
            target = f"{name}.{attr}" if name else attr
            try:
                gm.get_parameter(target)
            except AttributeError:
                continue
            _cut_last(gm, target, units, m.group)


def _cut_last(gm: fx.GraphModule, target: str, units: dict[str, Tensor], group: str | None) -> None:
    """Keep parameter ``target`` of ``gm`` at the alive features (:func:`channel_axis`) of
    ``group``."""
    value = gm.get_parameter(target)
    axis = channel_axis(value)
    keep = alive_features(units, group, 1, value.shape[axis]).to(value.device)
    parent, _, leaf = target.rpartition(".")
    owner = gm.get_submodule(parent) if parent else gm
    setattr(owner, leaf, param(value.index_select(axis, keep)))
