"""A task in training as a run directory keeps it: what the engine and the strategy hand to
the checkpoint at an epoch's end (:func:`snapshot`), and putting it back into a freshly built
learner to continue exactly where a killed run stopped (:func:`continue_training`)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch
from torch import Tensor

from espn.checkpoint import Checkpoint, TrainingSnapshot, TrainingState, restore_working
from espn.methods.base import Strategy
from espn.supernet.supernet import Supernet
from espn.training.engine import Engine
from espn.training.plan import TaskProgress

#: :class:`TaskProgress` fields the checkpoint stores as plain numbers (the optimizer's state
#: goes to the state file as tensors)
POSITION = tuple(f.name for f in fields(TaskProgress) if f.name != "optimizer")


def snapshot(task: int, progress: TaskProgress, strategy: Strategy) -> TrainingSnapshot:
    """Task ``task`` in training, at ``progress``, as the checkpoint stores it."""
    position = {k: getattr(progress, k) for k in POSITION}
    return TrainingSnapshot(task, position, progress.optimizer, strategy.state_dict())


def progress_of(training: TrainingState) -> TaskProgress:
    """Where the task in training read from a checkpoint continues (the engine's terms)."""
    return TaskProgress(**training.position, optimizer=training.optimizer)


def scaler_state(engine: Engine | None) -> dict[str, Any] | None:
    """The engine's mixed-precision loss scale (float16 on CUDA), which persists across tasks."""
    scaler = getattr(engine, "scaler", None)
    return scaler.state_dict() if scaler is not None and scaler.is_enabled() else None


def continue_training(
    ckpt: Checkpoint, supernet: Supernet, engine: Engine, strategy: Strategy
) -> None:
    """After :func:`espn.checkpoint.restore` of ``ckpt`` into ``supernet``: the task in
    training (its working sub-network and the strategy's state), the loss scale and the
    random-number generators, so that training continues as if never stopped."""
    tr = ckpt.training
    if tr is not None:
        restore_working(tr, supernet)
        device = next(supernet.parameters()).device
        strategy.load_state_dict(
            {k: v.to(device) if isinstance(v, Tensor) else v for k, v in tr.strategy.items()}
        )
    saved_scale = ckpt.manifest.get("grad_scaler")
    scaler = getattr(engine, "scaler", None)
    if saved_scale and scaler is not None and scaler.is_enabled():
        scaler.load_state_dict(saved_scale)
    torch.set_rng_state(ckpt.rng["torch"])
    if "engine" in ckpt.rng:  # not in a checkpoint saved without the engine
        engine.generator.set_state(ckpt.rng["engine"])
    if "cuda" in ckpt.rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(ckpt.rng["cuda"])
