"""Continual-learning methods as strategies over one engine, found by name in METHODS."""

from espn.methods import cpg, espn, individual, mtl, packnet, rmn, supsup
from espn.methods.base import METHODS, MethodConfig, Phase, Strategy

__all__ = [
    "METHODS",
    "MethodConfig",
    "Phase",
    "Strategy",
    "cpg",
    "espn",
    "individual",
    "mtl",
    "packnet",
    "rmn",
    "supsup",
]
