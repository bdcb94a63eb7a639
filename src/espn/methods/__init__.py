"""Continual-learning methods as strategies over one engine, found by name in METHODS."""

from espn.methods import espn, individual, mtl, packnet, supsup
from espn.methods.base import METHODS, MethodConfig, Phase, Strategy

__all__ = [
    "METHODS",
    "MethodConfig",
    "Phase",
    "Strategy",
    "espn",
    "individual",
    "mtl",
    "packnet",
    "supsup",
]
