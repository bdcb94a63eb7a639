"""The model registry: ``MODELS.get(name)(spec)`` builds a supernet-ready network, and
:func:`build_supernet` wraps it (the one place a run's or a checkpoint's supernet is built)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from espn.registry import Registry
from espn.settings.training import default
from espn.supernet.supernet import Supernet


@dataclass(frozen=True)
class ModelSpec:
    """What a model constructor needs to know about the benchmark."""

    input_shape: tuple[int, ...]
    n_classes: int
    multi_head: bool
    #: beyond the paper: per-task scale and shift on FC gates and a per-task output bias on a
    #: shared head (``--task-affine``); the paper's default is binary masks only
    task_affine: bool = default("task_affine")
    #: how the producers of a residual stream are pruned (``espn.models.resnet``): "coupled"
    #: (one unit group per stream) or "per-conv" (the authors'); default: the training
    #: setting's (:mod:`espn.settings.training`); models without residual streams ignore it
    stream_pruning: str = default("stream_pruning")


ModelFactory = Callable[[ModelSpec], nn.Module]
MODELS: Registry[ModelFactory] = Registry("model")


def build_supernet(
    name: str,
    spec: ModelSpec,
    example: Tensor,
    seed: int | None,
    device: str | torch.device = "cpu",
) -> Supernet:
    """The registered model ``name`` built for ``spec`` on ``device`` and wrapped as a supernet
    traced on ``example`` (moved to ``device``). Torch's RNG is seeded with ``seed`` first
    (None: left as it is, as ``espn.wrap`` does), so a run and the reload of its checkpoint
    start from the same initial weights."""
    if seed is not None:
        torch.manual_seed(seed)
    model = MODELS.get(name)(spec).to(device)
    return Supernet(model, example.to(device))
