"""Avalanche's class-incremental strategies on the data of benchmarks/task_agnostic_table.py:
the peers of espn's prediction without the task id.

Split Fashion-MNIST (5 tasks of 2 classes, 1000 training and 1000 test images a task, espn's
own task sequence and preprocessing, so the very images of the table) and scikit-learn's
digits (5 tasks of 2 classes, the table's split). One head of 10 classes (task t's classes
are 2t and 2t + 1), no task id at test time; Naive, LwF, EWC (without exemplars) and Replay
with 200 stored samples, on the table's networks (FC 784-1024-1024 for Fashion-MNIST, MLP
64-256-256 for the digits), Adam at 1e-3, batch 128, seed 0. Printed: one markdown row per
sequence and strategy, the accuracy over every task's test set after the last task (per
sample, no task id), which is what the table's "per sample" measures for espn.

    pip install 'espn[avalanche]'
    python benchmarks/task_agnostic_peers.py --data-dir DIR --epochs 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

STRATEGIES = ("naive", "lwf", "ewc", "replay-200")


def fashion(args: argparse.Namespace) -> list[tuple[Any, Any, Any, Any]]:
    """Split Fashion-MNIST as espn builds it: per task (train x, y, test x, y), labels global."""
    from espn.runs.building import build_benchmark
    from espn.runs.config import make_config

    cfg = make_config(
        benchmark="split-fashion-mnist", model="fc1024", method="espn", tasks=5,
        train_per_task=args.train, test_per_task=args.test, data_dir=args.data_dir,
        out=Path("unused"),
    )  # fmt: skip
    seq = build_benchmark(cfg, download=False)
    tasks = []
    for t, task in enumerate(seq.tasks):
        parts = []
        for split in (task.train, task.test):
            parts += [task.transform(split.x[split.index], False).flatten(1), split.y + 2 * t]
        tasks.append(tuple(parts))
    return tasks


def digits() -> list[tuple[Any, Any, Any, Any]]:
    """The table's split of scikit-learn's digits, labels global (the digit itself)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from task_agnostic_table import digits_tasks

    return [
        (xs.flatten(1), ys + 2 * t, xt.flatten(1), yt + 2 * t)
        for t, ((xs, ys), (xt, yt)) in enumerate(digits_tasks())
    ]


def mlp(inputs: int, hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )  # fmt: skip


def run(tasks: list[Any], hidden: int, name: str, epochs: int) -> float:
    """Accuracy (%) over every task's test set after ``name`` learned them in order."""
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.utils import (
        DataAttribute,
        TaskAwareSupervisedClassificationDataset,
        TaskLabels,
    )
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.training.supervised import EWC, LwF, Naive, Replay

    def dataset(x: Any, y: Any) -> Any:
        return TaskAwareSupervisedClassificationDataset(
            [torch.utils.data.TensorDataset(x, y)],
            data_attributes=[DataAttribute(y.tolist(), "targets"), TaskLabels([0] * len(y))],
        )

    stream = benchmark_from_datasets(train=[dataset(t[0], t[1]) for t in tasks])
    torch.manual_seed(0)
    model = mlp(tasks[0][0].shape[1], hidden)
    common = {
        "model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "criterion": nn.CrossEntropyLoss(), "train_mb_size": 128, "train_epochs": epochs,
        "eval_mb_size": 1024, "device": "cpu", "evaluator": EvaluationPlugin(loggers=[]),
    }  # fmt: skip
    strategy = {
        "naive": lambda: Naive(**common),
        "lwf": lambda: LwF(alpha=1.0, temperature=2.0, **common),
        "ewc": lambda: EWC(ewc_lambda=100.0, **common),
        "replay-200": lambda: Replay(mem_size=200, **common),
    }[name]()
    for experience in stream.train_stream:
        strategy.train(experience)
    model.eval()
    with torch.no_grad():
        x = torch.cat([t[2] for t in tasks])
        y = torch.cat([t[3] for t in tasks])
        return 100.0 * float((model(x).argmax(1) == y).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, help="where Fashion-MNIST is")
    parser.add_argument("--train", type=int, default=1000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per task")
    parser.add_argument("--sequences", default="split-fashion-mnist,split-digits")
    args = parser.parse_args()
    print("| sequence | strategy (Avalanche) | epochs per task | per sample (no task id) |")
    print("|---|---|---|---|")
    for sequence in args.sequences.split(","):
        tasks = fashion(args) if sequence == "split-fashion-mnist" else digits()
        hidden = 1024 if sequence == "split-fashion-mnist" else 256
        for name in STRATEGIES:
            acc = run(tasks, hidden, name, args.epochs)
            print(f"| {sequence} | {name} | {args.epochs} | {acc:.2f} |", flush=True)


if __name__ == "__main__":
    main()
