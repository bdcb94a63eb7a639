"""The training engine shared by every method."""

from espn.training.engine import Engine
from espn.training.optim import OptimConfig

__all__ = ["Engine", "OptimConfig"]
