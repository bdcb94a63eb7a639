"""The supernet, its masked layers, per-task masks and the analytic FLOP count."""

from espn.supernet.flops import LayerCost, count_flops, trace_costs, unit_flops
from espn.supernet.layers import (
    MaskedConv2d,
    MaskedLayer,
    MaskedLinear,
    TaskBatchNorm2d,
    TaskBias,
    TaskGroupNorm,
    TaskHead,
    TaskSpecific,
    UnitGate,
    UnitModule,
)
from espn.supernet.masks import TaskMask, pack_bits, unpack_bits
from espn.supernet.supernet import Supernet

__all__ = [
    "LayerCost",
    "MaskedConv2d",
    "MaskedLayer",
    "MaskedLinear",
    "Supernet",
    "TaskBatchNorm2d",
    "TaskBias",
    "TaskGroupNorm",
    "TaskHead",
    "TaskMask",
    "TaskSpecific",
    "UnitGate",
    "UnitModule",
    "count_flops",
    "pack_bits",
    "trace_costs",
    "unit_flops",
    "unpack_bits",
]
