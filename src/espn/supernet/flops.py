"""Analytic FLOPs of a sub-network, following which units are alive: 2 x the multiply-adds
of its convolutions, linear layers and attention products for one sample, as
``FlopCounterMode`` counts them (docs/algorithm.md, "FLOPs convention")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from espn.supernet.layers import MaskedLayer, TaskHead


@dataclass
class LayerCost:
    """Shape facts of one costed layer needed to count its FLOPs under any unit mask."""

    name: str
    module: MaskedLayer | TaskHead
    in_units: str | None
    out_units: str | None
    positions: int  # output positions per sample (H*W for conv, 1 for linear on vectors)
    kernel_area: int
    in_unit_size: int = 1
    out_unit_size: int = 1
    #: the unit group of the rows a token linear layer is applied over (``positions`` then
    #: counts one row's)
    rows: str | None = None

    def alive_in(self, alive: dict[str, int]) -> int:
        """Alive input features (units times their width; all of them without units)."""
        if self.in_units:
            return alive[self.in_units] * self.in_unit_size
        return int(self.module.weight.shape[1])

    def alive_out(self, alive: dict[str, int]) -> int:
        """Alive output features (units times their width; all of them without units)."""
        if self.out_units:
            return alive[self.out_units] * self.out_unit_size
        return int(self.module.weight.shape[0])

    def per_pair(self, alive: dict[str, int]) -> float:
        """FLOPs of one alive (input, output) pair per sample: over the alive rows, if any."""
        return 2.0 * self.kernel_area * self.positions * (alive[self.rows] if self.rows else 1)

    def flops(self, alive: dict[str, int]) -> float:
        """2 x MACs per sample with ``alive`` units in the layer's input and output groups."""
        return self.per_pair(alive) * self.alive_in(alive) * self.alive_out(alive)


@dataclass
class AttentionCost:
    """The activation-by-activation products of one self-attention module: ``QK^T`` and
    ``AV`` cost ``2 * head_dim`` each per alive head of ``group`` and pair of a sample's tokens."""

    name: str
    group: str
    head_dim: int
    pairs: int

    @property
    def per_head(self) -> float:
        """FLOPs of one head's two matmuls for one sample."""
        return 4.0 * self.pairs * self.head_dim

    def flops(self, alive: dict[str, int]) -> float:
        """FLOPs of the alive heads' matmuls for one sample."""
        return self.per_head * alive[self.group]


@dataclass
class ProductCost:
    """The products of a module whose layers' channels are kept whole (Swin's window
    attention), as ``FlopCounterMode`` measured them per sample at wrap (``espn_products``)."""

    name: str
    per_sample: float

    def flops(self, alive: dict[str, int]) -> float:
        return self.per_sample


Cost = LayerCost | AttentionCost | ProductCost


def layer_cost(name: str, m: nn.Module, out: Tensor, batch: int) -> LayerCost | None:
    """The cost of masked layer or task head ``m`` from its output ``out`` on a batch of
    ``batch`` samples: positions per sample are a sample's output elements per feature
    (features on dimension 1 for a conv, last for a linear layer; ``out`` may hold several
    rows per sample); a lookup table, uncounted by FlopCounterMode, has
    ``counts_flops = False``."""
    if not getattr(m, "counts_flops", True):
        return None
    weight = m.weight
    assert isinstance(weight, Tensor)
    features = out.shape[1 if weight.dim() > 2 else -1]
    rows = getattr(m, "row_units", None)
    return LayerCost(
        name=name,
        module=m,  # type: ignore[arg-type]
        in_units=getattr(m, "in_units", None),
        out_units=getattr(m, "out_units", None),
        positions=out.numel() // batch // features // (out.shape[-2] if rows else 1),
        kernel_area=int(torch.Size(weight.shape[2:]).numel()),
        in_unit_size=getattr(m, "in_unit_size", 1),
        out_unit_size=getattr(m, "out_unit_size", 1),
        rows=rows,
    )


def run_eval(
    model: nn.Module,
    example: Tensor,
    hooks: Iterable[torch.utils.hooks.RemovableHandle] = (),
    grad: bool = False,
) -> Any:
    """``model(example)`` in eval mode (with gradients if ``grad``) for the forward ``hooks``
    to see, which are removed after; the model's mode is restored."""
    was_training = model.training
    model.eval()
    try:
        with torch.set_grad_enabled(grad):
            return model(example)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()


def trace_costs(model: nn.Module, example_input: Tensor) -> list[Cost]:
    """Run ``example_input`` (a batch) through ``model`` and record what every costed module
    costs per sample: a masked layer's or task head's output positions (:func:`layer_cost`),
    a self-attention module's pairs of tokens, a module's products on channels kept whole."""
    costs: dict[str, Cost] = {}
    hooks = []
    batch = len(example_input)
    for name, module in model.named_modules():
        if hasattr(module, "espn_products"):
            costs[name] = ProductCost(name, module.espn_products)
        # a self-attention module is one with heads as units (``heads_group``, ``head_dim``)
        if not isinstance(module, MaskedLayer | TaskHead) and not hasattr(module, "heads_group"):
            continue

        def hook(mod: Any, inp: tuple[Tensor, ...], out: Tensor, name: str = name) -> None:
            if hasattr(mod, "heads_group"):
                pairs = len(inp[0]) * inp[0].shape[1] ** 2 // batch
                costs[name] = AttentionCost(name, mod.heads_group, mod.head_dim, pairs)
            elif (cost := layer_cost(name, mod, out, batch)) is not None:
                costs[name] = cost

        hooks.append(module.register_forward_hook(hook))
    run_eval(model, example_input, hooks)
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    # activation products first, then the layers (the order they were listed in)
    return sorted(costs.values(), key=lambda c: (isinstance(c, LayerCost), order[c.name]))


def count_flops(costs: list[Cost], alive: dict[str, int]) -> float:
    """FLOPs of the network whose unit groups have ``alive[group]`` units alive."""
    return sum(c.flops(alive) for c in costs)


#: what the FLOPs load of a unit counts: ``output`` (the paper: the cost of computing the
#: unit's output, from its alive inputs) or ``total`` (beyond the paper: also the cost its
#: output causes in the layers that consume it)
FLOP_LOADS = ("output", "total")


def unit_flops(costs: list[Cost], alive: dict[str, int], load: str = "output") -> dict[str, float]:
    """FLOPs carried by one unit of each group in the current sub-network, FLOP_l(m):
    ``load="output"`` (the paper's) its incoming connections in every layer producing it,
    ``"total"`` also its outgoing ones in the layers consuming it."""
    if load not in FLOP_LOADS:
        raise ValueError(f"unknown FLOP load {load!r}; choose one of: {', '.join(FLOP_LOADS)}")
    out = dict.fromkeys(alive, 0.0)
    for c in costs:
        if isinstance(c, AttentionCost):  # a head's QK^T and AV: part of computing its output
            out[c.group] += c.per_head
        if not isinstance(c, LayerCost):
            continue
        per_pair = c.per_pair(alive)
        if c.out_units:
            out[c.out_units] += per_pair * c.alive_in(alive) * c.out_unit_size
        if c.in_units and load == "total":
            out[c.in_units] += per_pair * c.alive_out(alive) * c.in_unit_size
    return out
