"""The classifier of a model the converter reads: the layers whose outputs reach the model's
output through parameter-free operations only (docs/architectures.md); each becomes a task
head, with as many outputs as the model (heads are combined elementwise)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from espn.layers import ConvertError
from espn.models.probe import adapter, downstream

if TYPE_CHECKING:
    import torch_pruning as tp

#: what a classifier may be, for messages
_SUPPORTED = (
    "the model must end in classifier layers (nn.Linear, or nn.Conv2d then pooling) whose "
    "outputs reach the model's output through parameter-free operations only (activations, "
    "pooling, flatten, sums or means of heads)"
)


def output_layers(
    model: nn.Module, example: Tensor, graph: tp.DependencyGraph, modules: dict[str, nn.Module]
) -> list[str]:
    """The names of the output layers of ``model`` among its convertible ``modules`` (every
    one used by ``forward``, in ``graph``), checked to be a classifier; refused otherwise in
    one line."""
    layers = {id(m) for m in modules.values()}
    flows = {n: downstream(graph, m) for n, m in modules.items()}  # walked until a layer
    outputs = [n for n, nodes in flows.items() if all(id(d.module) not in layers for d in nodes)]
    if not outputs:
        raise ConvertError(f"{_SUPPORTED}; found no output layer")
    with torch.no_grad():
        out = model(example)
    classes = out.shape[-1] if isinstance(out, Tensor) and out.dim() == 2 else None
    for name in outputs:
        m = modules[name]
        layer = adapter(m)
        if not layer.can_be_head or layer.groups(m) != 1:
            raise ConvertError(f"{_SUPPORTED}; found {name!r}, a {type(m).__name__}")
        if getattr(m, "padding_mode", "zeros") != "zeros":
            raise ConvertError(
                f"classifier {name!r} pads with {m.padding_mode!r}; supported: zero padding"
            )
        width = layer.width(m, True)
        if width != classes:
            shape = list(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ConvertError(
                f"classifier {name!r} has {width} outputs but the model outputs {shape}; "
                f"{_SUPPORTED}, each with one output per class of the model's [N, classes]"
            )
    return outputs
