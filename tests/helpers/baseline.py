"""Helpers of the baseline, pruner and study tests: small models and tiny task sequences."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from espn.data.tasks import Split, Task, TaskSequence
from espn.methods.base import METHODS, MethodConfig, Strategy
from espn.methods.cpg import CPG
from espn.models.fc import FCNet
from espn.models.registry import ModelSpec
from espn.supernet import Supernet
from espn.training.engine import Engine
from espn.training.optim import OptimConfig


def fc_small(spec: ModelSpec) -> FCNet:
    """784-48-32-classes: FC1024's shape at a test's size."""
    return FCNet(
        math.prod(spec.input_shape), [48, 32], spec.n_classes, spec.multi_head, spec.task_affine
    )


def tiny_sequence(
    n_tasks: int = 3,
    n_classes: int = 3,
    shape: tuple[int, ...] = (1, 8, 8),
    n: int = 48,
    seed: int = 0,
    offset: float = 0.0,
) -> TaskSequence:
    """Multi-head tasks of noisy class prototypes; task t's inputs are shifted by t x offset
    by its transform (so a mixed batch shows whose transform each sample went through)."""
    gen = torch.Generator().manual_seed(seed)
    tasks = []
    for t in range(n_tasks):
        protos = torch.randn(n_classes, *shape, generator=gen)
        splits = []
        for _ in range(2):
            y = torch.arange(n) % n_classes
            x = protos[y] + 0.5 * torch.randn(n, *shape, generator=gen)
            splits.append(Split(x, torch.arange(n), y))

        def transform(x: torch.Tensor, train: bool, shift: float = t * offset) -> torch.Tensor:
            return x + shift

        tasks.append(Task(f"tiny {t}", splits[0], splits[1], transform, n_classes))
    return TaskSequence("tiny", tasks, shape, multi_head=True)


def make_engine(
    model: torch.nn.Module,
    seq: TaskSequence,
    method: str,
    optim: OptimConfig | None = None,
    seed: int = 0,
    **method_options: object,
) -> tuple[Supernet, Strategy, Engine]:
    """A supernet around ``model``, the named method and an engine to train ``seq`` with."""
    example = seq.tasks[0].transform(seq.tasks[0].train.x[:2], False)
    sn = Supernet(model, example)
    general = {k: v for k, v in method_options.items() if k in MethodConfig.__dataclass_fields__}
    own = {k: v for k, v in method_options.items() if k not in general}
    base = {"epochs": (1, 1, 1), "gamma": 1.0, "alpha": 0.05}  # dense, the MNIST budget
    cfg = MethodConfig(**base | general, method_options=own)  # type: ignore[arg-type]
    strategy = METHODS.get(method)(cfg)
    engine = Engine(
        sn,
        strategy,
        optim or OptimConfig("adam", lr=1e-2),
        batch_size=16,
        seed=seed,
    )
    return sn, strategy, engine


CPG_MEASURED, CPG_SNAPSHOT = CPG._measured, CPG._take_snapshot  # before any test patches them


def scripted_cpg(
    monkeypatch: pytest.MonkeyPatch, accuracies: list[float], **options: Any
) -> tuple[Supernet, Strategy, Any, list[dict[str, torch.Tensor]]]:
    """A one-task CPG run whose measured accuracies (train phase, then each compacting
    round) are ``accuracies``; returns the supernet, the strategy, the log and the
    snapshots taken (after the train phase, then after each kept round)."""
    seq = tiny_sequence(n_tasks=1)
    torch.manual_seed(0)
    model = FCNet(64, [32, 24], 3, multi_head=True)
    sn, strategy, engine = make_engine(model, seq, "cpg", epochs=(1, 1, 0), **options)
    scripted = iter(accuracies)
    snapshots: list[dict[str, torch.Tensor]] = []

    def measured(self):
        CPG_MEASURED(self)
        return next(scripted)

    def take_snapshot(self, supernet):
        CPG_SNAPSHOT(self, supernet)
        snapshots.append({k: v.clone() for k, v in self.snapshot.items()})

    monkeypatch.setattr(CPG, "_measured", measured)
    monkeypatch.setattr(CPG, "_take_snapshot", take_snapshot)
    log = engine.train_task(seq.tasks[0], 0)
    return sn, strategy, log, snapshots
