"""Checks shared by the architecture tests: two tasks on a converted net with task 0
bit-identical and an exact export, a net registered as a tiny benchmark, an exact resume."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from espn.api.experiment import run_experiment
from espn.data.registry import BENCHMARKS, Benchmark
from espn.data.tasks import TaskSequence
from espn.evaluation import task_logits
from espn.export.export import export_task, load_exported, measured_flops
from espn.export.slim import slim_copy
from espn.methods.base import METHODS, MethodConfig
from espn.models import MODELS, ModelSpec
from espn.models.convert import to_supernet
from espn.runs.config import make_config
from espn.supernet import Supernet
from espn.training import Engine, OptimConfig
from helpers.deploy import Killed, comparable, kill_at_step, tiny_sequence
from helpers.images import random_task

#: SGD with momentum and Adam, each with weight decay: what must never move a frozen weight
OPTIMIZERS = [
    OptimConfig("sgd", lr=0.05, momentum=0.9, weight_decay=1e-2),
    OptimConfig("adam", lr=1e-2, weight_decay=1e-2, betas=(0.0, 0.999)),
]


def check_two_tasks(
    net: Callable[[], nn.Module],
    optim: OptimConfig,
    tmp_path: Path,
    export: bool = True,
    seq: TaskSequence | None = None,
) -> Supernet:
    """ESPN-0.5 on two tiny tasks (``seq``, default the 1x8x8 ones): task 0's logits and
    frozen weights bit-identical after task 1, both tasks within their FLOP and weight
    budgets, and (``export``) task 1's written slim model with the FLOPs counted (equal to
    FlopCounterMode on it) and the supernet's outputs. Returns the supernet."""
    seq = seq or tiny_sequence(n_tasks=2)
    torch.manual_seed(0)
    x0 = seq.tasks[0].train.x[:2]
    sn = Supernet(to_supernet(net(), x0), x0)
    strategy = METHODS.get("espn")(MethodConfig(gamma=0.5, alpha=0.5, epochs=(1, 1, 1)))
    engine = Engine(sn, strategy, optim, batch_size=16, seed=0)
    engine.train_task(seq.tasks[0], 0)
    assert sn.masks[0].new_weights <= strategy.weight_budget
    logits = task_logits(sn, seq.tasks[0], 0)
    frozen = {n: layer.weight.detach().clone() for n, layer in sn.layers.items()}
    engine.train_task(seq.tasks[1], 1)
    assert sn.masks[1].new_weights <= strategy.weight_budget
    assert torch.equal(task_logits(sn, seq.tasks[0], 0), logits)
    assert any(not torch.equal(frozen[n], m.weight) for n, m in sn.layers.items())
    for n, layer in sn.layers.items():
        mask = sn.masks[0].weight_mask(n)
        assert torch.equal(layer.weight[mask], frozen[n][mask])
    for t in (0, 1):
        sn.use_task(t)
        assert sn.flops() <= 0.5 * sn.dense_flops
    if export:  # export_task refuses a model whose FLOPs or outputs differ
        x = seq.tasks[1].test.x
        report = export_task(sn, 1, [x], tmp_path / "task1.pt2", also_onnx=False)
        assert report.flops == sn.flops(sn.masks[1].units) < sn.dense_flops
        assert torch.allclose(load_exported(report.files[0])(x), sn(x, task=1), atol=1e-5)
    return sn


def assert_random_task_exports_exactly(sn: Supernet, x: torch.Tensor, n_classes: int) -> None:
    """A random half-size task 0 on ``sn``: its slim copy costs what the supernet counts
    (FlopCounterMode) and computes the supernet's outputs."""
    random_task(sn, n_classes, x, torch.Generator().manual_seed(1), 0.5)
    slim = slim_copy(sn, 0, x[:1])
    sn.use_task(0)
    sn.eval()
    assert measured_flops(slim, x) == sn.flops() < sn.dense_flops
    torch.testing.assert_close(slim(x), sn(x, task=0), rtol=1e-4, atol=1e-4)


@contextmanager
def registered_run(model: str, benchmark: str, net: Callable[[int], nn.Module]) -> Iterator[str]:
    """Model ``model`` (``net(n_classes)`` converted) and benchmark ``benchmark`` (1x8x8
    tiny tasks, one head each, on that model) registered for the block; yields the
    benchmark's name."""
    bench = Benchmark(
        build=lambda args: tiny_sequence(args.n_tasks or 2, seed=args.seed),
        default_tasks=2,
        max_tasks=None,
        description=f"tiny tasks on {model}",
        defaults={"model": model, "batch_size": 16, "optimizer": "sgd", "lr": 0.05},
    )

    def factory(spec: ModelSpec) -> nn.Module:
        return to_supernet(net(spec.n_classes), torch.zeros(2, *spec.input_shape))

    with MODELS.temporarily(model, factory), BENCHMARKS.temporarily(benchmark, bench):
        yield benchmark


def fingerprint(run: Path) -> tuple[object, ...]:
    """A run directory's results without timings, and the SHA-256 of its task files and of
    its final state."""
    manifest = json.loads((run / "checkpoint" / "manifest.json").read_text())
    return (
        comparable(json.loads((run / "results.json").read_text())),
        [t["sha256"] for t in manifest["tasks"]],
        manifest["state"]["sha256"],
    )


def assert_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **run_options: Any
) -> None:
    """A run of ``run_options`` (ESPN-0.5, epochs 1,2,1, momentum 0.9 unless given) killed
    at its 17th step and resumed ends with the same results, task files and final state as
    one run straight through."""
    options = {"epochs": (1, 2, 1), "momentum": 0.9, "gamma": 0.5} | run_options
    run_experiment(make_config(**options, out=tmp_path / "reference"), progress=False)
    cfg = make_config(**options, out=tmp_path / "run")
    with monkeypatch.context() as mp:
        kill_at_step(mp, 17)  # tiny tasks of 12 steps: task 1, in its second phase
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    run_experiment(cfg, progress=False, resume=True)
    assert fingerprint(tmp_path / "run") == fingerprint(tmp_path / "reference")
