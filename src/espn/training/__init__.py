"""The training engine shared by every method."""

from espn.training.engine import Engine
from espn.training.optim import OPTIMIZERS, FrozenGuard, OptimConfig, build_optimizer
from espn.training.plan import TaskLog

__all__ = ["OPTIMIZERS", "Engine", "FrozenGuard", "OptimConfig", "TaskLog", "build_optimizer"]
