"""Helpers of the checkpoint, resume and export tests: tiny models, tasks and runs."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from espn.data.tasks import Split, Task, TaskSequence
from espn.layers.batchnorm2d import TaskBatchNorm2d
from espn.layers.conv2d import MaskedConv2d
from espn.methods.base import METHODS, MethodConfig, Strategy
from espn.models.fc import FCNet
from espn.models.registry import ModelSpec
from espn.supernet import Supernet, TaskHead
from espn.training.callbacks import Callback, CallbackList, EpochEnd, StepEnd
from espn.training.engine import Engine
from espn.training.optim import OptimConfig

TIMING_KEYS = {"seconds", "seconds_per_epoch", "wall_time_s"}


class TinyResNet(nn.Module):
    """Conv stem, one residual block (the stream group is shared by conv0 and conv2), a
    strided conv, global pooling and a per-task head."""

    def __init__(self, n_classes: int = 3) -> None:
        super().__init__()
        self.conv0 = MaskedConv2d(1, 8, 3, padding=1, out_units="stream")
        self.bn0 = TaskBatchNorm2d(8, "stream")
        self.conv1 = MaskedConv2d(8, 6, 3, padding=1, in_units="stream", out_units="inner")
        self.bn1 = TaskBatchNorm2d(6, "inner")
        self.conv2 = MaskedConv2d(6, 8, 3, padding=1, in_units="inner", out_units="stream")
        self.bn2 = TaskBatchNorm2d(8, "stream")
        self.conv3 = MaskedConv2d(
            8, 10, 3, stride=2, padding=1, in_units="stream", out_units="down"
        )
        self.bn3 = TaskBatchNorm2d(10, "down")
        self.head = TaskHead(10, n_classes, in_units="down")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.relu(self.bn0(self.conv0(x)))
        h = F.relu(self.bn1(self.conv1(s)))
        s = F.relu(s + self.bn2(self.conv2(h)))
        h = F.relu(self.bn3(self.conv3(s)))
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


def tiny_sequence(n_tasks: int = 3, n_classes: int = 3, n: int = 48, seed: int = 0) -> TaskSequence:
    """Learnable 1x8x8 tasks: noisy class prototypes, a fresh set per task."""
    gen = torch.Generator().manual_seed(seed)
    tasks = []
    for t in range(n_tasks):
        protos = torch.randn(n_classes, 1, 8, 8, generator=gen)
        splits = []
        for _ in range(2):
            y = torch.arange(n) % n_classes
            x = protos[y] + 0.5 * torch.randn(n, 1, 8, 8, generator=gen)
            splits.append(Split(x, torch.arange(n), y))
        tasks.append(Task(f"tiny {t}", splits[0], splits[1], lambda x, train: x, n_classes))
    return TaskSequence("tiny", tasks, (1, 8, 8), multi_head=True)


def make_model(kind: str, n_classes: int = 3) -> nn.Module:
    if kind == "conv":
        return TinyResNet(n_classes)
    return FCNet(64, [32, 24], n_classes, multi_head=True)


def train_tiny(kind: str, n_tasks: int = 3, seed: int = 0) -> tuple[Supernet, TaskSequence, Engine]:
    """A supernet with ``n_tasks`` tiny tasks learned by ESPN-0.5 (one epoch per phase)."""
    seq = tiny_sequence(n_tasks)
    torch.manual_seed(seed)
    sn = Supernet(make_model(kind), seq.tasks[0].train.x[:2])
    strategy: Strategy = METHODS.get("espn")(MethodConfig(gamma=0.5, alpha=0.3, epochs=(1, 1, 1)))
    engine = Engine(sn, strategy, OptimConfig("adam", lr=1e-2), batch_size=16, seed=seed)
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
    return sn, seq, engine


def fc_test(spec: ModelSpec) -> FCNet:
    """784-64-48-classes: FC1024's shape, small enough for tests."""
    return FCNet(
        math.prod(spec.input_shape), [64, 48], spec.n_classes, spec.multi_head, spec.task_affine
    )


def run_options(out: Path, **overrides: Any) -> dict[str, Any]:
    """``make_config`` keywords of a seconds-long run (16 steps per task) on the fake data."""
    return {
        "benchmark": "permuted-mnist",
        "model": "fc-test",
        "tasks": 3,
        "epochs": (1, 2, 1),
        "batch_size": 128,
        "optimizer": "adam",
        "weight_decay": 1e-4,
        "out": out,
        **overrides,
    }


def cli_options(out: Path) -> list[str]:
    """The same run as :func:`run_options` as ``espn run`` arguments."""
    return [
        "run",
        "--benchmark",
        "permuted-mnist",
        "--model",
        "fc-test",
        "--tasks",
        "3",
        "--epochs",
        "1,2,1",
        "--batch-size",
        "128",
        "--optimizer",
        "adam",
        "--weight-decay",
        "1e-4",
        "--out",
        str(out),
        "--no-progress",
        "--quiet",
    ]


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """A results document without its timings and output path."""
    out = {k: v for k, v in doc.items() if k not in TIMING_KEYS}
    out["config"] = {k: v for k, v in doc["config"].items() if k != "out"}
    return out


class Killed(Exception):
    """Stands for the process dying."""


def watch_engines(monkeypatch: pytest.MonkeyPatch, callback: Callback) -> None:
    """Tell ``callback`` of every engine's training events, before the engine's own
    callbacks, whatever drives the engine (a learner, a sweep, a test's own): every engine
    tells its :class:`CallbackList` of each."""
    for hook in ("on_train_start", "on_epoch_start", "on_step_end", "on_epoch_end", "on_train_end"):
        real = getattr(CallbackList, hook)

        def both(self: CallbackList, *args: Any, _real: Any = real, _hook: str = hook) -> None:
            getattr(callback, _hook)(*args)
            _real(self, *args)

        monkeypatch.setattr(CallbackList, hook, both)


class _Kill(Callback):
    def __init__(self, kill: int) -> None:
        self.kill, self.steps = kill, 0

    def on_step_end(self, learner: Any, event: StepEnd) -> None:
        self.steps += 1
        if self.steps == self.kill:
            raise Killed


def kill_at_step(monkeypatch: pytest.MonkeyPatch, kill: int) -> None:
    """Make the engine's ``kill``-th optimizer step raise :class:`Killed` as it ends, before
    anything after it (a prune event, an epoch's checkpoint): a kill mid-run."""
    watch_engines(monkeypatch, _Kill(kill))


class AtEpochEnd(Callback):
    """Calls ``record(phase, epoch)`` after every epoch, once the supernet holds what a slim
    copy trained (the epoch's position read first, as the run directory reads it)."""

    def __init__(self, record: Callable[[str, int], None]) -> None:
        self.record = record

    def on_epoch_end(self, learner: Any, event: EpochEnd) -> None:
        assert event.position is not None
        self.record(event.phase, event.epoch)
