"""The training engine shared by every method."""

from espn.training.engine import Engine, TaskLog
from espn.training.optim import OPTIMIZERS, FrozenGuard, OptimConfig, build_optimizer

__all__ = ["OPTIMIZERS", "Engine", "FrozenGuard", "OptimConfig", "TaskLog", "build_optimizer"]
