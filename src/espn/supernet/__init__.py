"""The supernet, its masked layers, per-task masks and the analytic FLOP count."""

from espn.supernet.layers import (
    MaskedConv2d,
    MaskedLayer,
    MaskedLinear,
    TaskBatchNorm2d,
    TaskBias,
    TaskGroupNorm,
    TaskHead,
    UnitGate,
    UnitModule,
)
from espn.supernet.masks import TaskMask, pack_bits, unpack_bits
from espn.supernet.supernet import Supernet

__all__ = [
    "MaskedConv2d",
    "MaskedLayer",
    "MaskedLinear",
    "Supernet",
    "TaskBatchNorm2d",
    "TaskBias",
    "TaskGroupNorm",
    "TaskHead",
    "TaskMask",
    "UnitGate",
    "UnitModule",
    "pack_bits",
    "unpack_bits",
]
