"""Continual-learning methods as strategies over one engine, found by name in METHODS."""

from espn.methods import cpg, espn, individual, mtl, packnet, rmn, supsup
from espn.methods.base import METHODS, MethodConfig, Phase, Strategy, create_method
from espn.methods.options import Option

__all__ = [
    "METHODS",
    "MethodConfig",
    "Option",
    "Phase",
    "Strategy",
    "cpg",
    "create_method",
    "espn",
    "individual",
    "mtl",
    "packnet",
    "rmn",
    "supsup",
]
