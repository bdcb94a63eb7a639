"""Analytic FLOPs of a sub-network, following which units are really alive.

Convention: FLOPs = 2 x multiply-accumulates of the convolution and linear layers (the
count of :class:`torch.utils.flop_counter.FlopCounterMode`), for one input sample.
BatchNorm, gates, activations, pooling, additions and products (the scale of a
squeeze-excitation block) are not counted; the convolutions of a squeeze-excitation block
are counted like any other (one output position each). A layer with ``a_in`` alive input
units and ``a_out`` alive output units costs ``2 * a_in * a_out * kernel_area *
output_positions`` FLOPs. Two shapes refine ``a_in``: a depthwise convolution reads one input
channel per output channel (``a_in`` = 1, its weight's input width: its channels are its
output units), and a linear layer reading a flattened feature map reads ``in_repeat``
inputs per alive channel (``a_in`` = alive channels x ``in_repeat``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from espn.supernet.layers import MaskedLayer, TaskHead, is_costed


@dataclass
class LayerCost:
    """Shape facts of one costed layer needed to count its FLOPs under any unit mask."""

    name: str
    module: MaskedLayer | TaskHead
    in_units: str | None
    out_units: str | None
    positions: int  # output positions per sample (H*W for conv, 1 for linear on vectors)
    kernel_area: int
    in_repeat: int = 1  # inputs per input unit (a flattened feature map: H*W)

    @property
    def in_size(self) -> int:
        """Input features/channels of the full-width layer."""
        w = self.module.weight
        return int(w.shape[1])

    @property
    def out_size(self) -> int:
        """Output features/channels of the full-width layer."""
        return int(self.module.weight.shape[0])

    def flops(self, alive: dict[str, int]) -> float:
        """2 x MACs per sample with ``alive`` units in the layer's input and output groups."""
        return 2.0 * self.alive_inputs(alive) * self.alive_outputs(alive) * self.per_pair

    @property
    def per_pair(self) -> int:
        """Multiply-accumulate positions of one (input, output) pair: kernel x positions."""
        return self.kernel_area * self.positions

    def alive_inputs(self, alive: dict[str, int]) -> int:
        """Inputs each output reads: alive input units x ``in_repeat`` (the full width when
        the input is not pruned; 1 for a depthwise convolution)."""
        return alive[self.in_units] * self.in_repeat if self.in_units else self.in_size

    def alive_outputs(self, alive: dict[str, int]) -> int:
        """Alive outputs (the full width when the output is not pruned)."""
        return alive[self.out_units] if self.out_units else self.out_size


def trace_costs(model: nn.Module, example_input: Tensor) -> list[LayerCost]:
    """Run ``example_input`` (a batch) through ``model`` and record every costed layer's shape."""
    records: dict[str, int] = {}
    hooks = []
    modules = {name: m for name, m in model.named_modules() if is_costed(m)}
    for name, module in modules.items():

        def hook(mod: nn.Module, inp: tuple[Tensor, ...], out: Tensor, name: str = name) -> None:
            records[name] = out[0].numel() // out.shape[1]

        hooks.append(module.register_forward_hook(hook))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(example_input)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    costs = []
    for name, module in modules.items():
        if name not in records:
            continue
        groups = getattr(module, "groups", 1)
        if groups != 1 and (module.in_units is not None or module.weight.shape[1] != 1):
            raise ValueError(
                f"grouped convolution {name!r} (groups={groups}) is not depthwise; the FLOP "
                "count supports depthwise convolutions only"
            )
        kernel = module.weight.shape[2:]
        costs.append(
            LayerCost(
                name=name,
                module=module,
                in_units=module.in_units,
                out_units=module.out_units,
                positions=records[name],
                kernel_area=int(torch.Size(kernel).numel()),
                in_repeat=module.in_repeat,
            )
        )
    return costs


def count_flops(costs: list[LayerCost], alive: dict[str, int]) -> float:
    """FLOPs of the network whose unit groups have ``alive[group]`` units alive."""
    return sum(c.flops(alive) for c in costs)


#: what the FLOPs load of a unit counts: ``output`` (the paper: the cost of computing the
#: unit's output, from its alive inputs) or ``total`` (beyond the paper: also the cost its
#: output causes in the layers that consume it)
FLOP_LOADS = ("output", "total")


def unit_flops(
    costs: list[LayerCost], alive: dict[str, int], load: str = "output"
) -> dict[str, float]:
    """FLOPs carried by one unit of each group in the current sub-network, FLOP_l(m).

    ``load="output"`` (the paper's definition, "determined by its input feature dimensions
    and operations"): the multiply-adds that compute the unit, i.e. its incoming connections
    in every layer that produces it. ``load="total"`` adds its outgoing connections in the
    layers that consume it.
    """
    if load not in FLOP_LOADS:
        raise ValueError(f"unknown FLOP load {load!r}; choose one of: {', '.join(FLOP_LOADS)}")
    out = dict.fromkeys(alive, 0.0)
    for c in costs:
        per_pair = 2.0 * c.per_pair
        if c.out_units:
            out[c.out_units] += per_pair * c.alive_inputs(alive)
        if c.in_units and load == "total":
            out[c.in_units] += per_pair * c.alive_outputs(alive) * c.in_repeat
    return out
