"""The supernet, the base of its masked layers, per-task masks and the analytic FLOP count."""

from espn.supernet.layers import (
    MaskedLayer,
    TaskBias,
    TaskHead,
    UnitGate,
    UnitModule,
)
from espn.supernet.masks import TaskMask, pack_bits, unpack_bits
from espn.supernet.supernet import Supernet

__all__ = [
    "MaskedLayer",
    "Supernet",
    "TaskBias",
    "TaskHead",
    "TaskMask",
    "UnitGate",
    "UnitModule",
    "pack_bits",
    "unpack_bits",
]
