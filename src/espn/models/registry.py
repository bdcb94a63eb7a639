"""The model registry: ``MODELS.get(name)(spec)`` builds a supernet-ready network."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from espn.registry import Registry


@dataclass(frozen=True)
class ModelSpec:
    """What a model constructor needs to know about the benchmark."""

    input_shape: tuple[int, ...]
    n_classes: int
    multi_head: bool
    #: beyond the paper: per-task scale and shift on FC gates and a per-task output bias on a
    #: shared head (``--task-affine``); the paper's default is binary masks only
    task_affine: bool = False


ModelFactory = Callable[[ModelSpec], nn.Module]
MODELS: Registry[ModelFactory] = Registry("model")
