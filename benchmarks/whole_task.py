"""Whole tasks as a user runs them: ``espn run`` against a plain PyTorch loop doing the same
optimizer steps on the same data.

For each method, ``espn run`` trains and evaluates the tasks in a subprocess (its own
command line, ``OMP_NUM_THREADS`` set to ``--threads``), and a plain PyTorch loop trains the
network a user would write for the benchmark, ``nn.Sequential`` of ``nn.Linear`` layers
784-1024-1024-10 with ``torch.optim.RMSprop`` at the run's learning rate (no masks, no
penalty, no pruning), on the same tasks' batches (espn's data: same images, transform and
batch size), for exactly as many optimizer steps as espn's run took on each task (read from
its ``results.json``), then evaluates it on the task's test set. The two alternate
``--repeats`` times (a machine shared with other work slows both alike) and the table prints
the medians:

* ``train s``: espn's training time of the tasks (``seconds`` in ``results.json``: the steps,
  prune events, BatchNorm recalibration and commit) against the plain loop's steps;
* ``plain+L2``: the same plain loop with the recipe's L2 term added to its loss as a user
  writes it (``masked_l2 * ||w||_2 / sqrt(n)`` over the hidden layers' weights as one
  vector, the layers espn's term covers), where the method's recipe has the term (ESPN and
  PackNet): the plain loop above computes less than espn's recipe asks for, this one the same
  objective (its accuracy is not printed; its training time and ratio are);
* ``run s``: espn's whole run (``wall_time_s``: also evaluation and checkpoints) against the
  plain loop's steps and test pass;
* ``process s``: the ``espn run`` process from start to exit (interpreter start and imports
  included), for reference.

    python benchmarks/whole_task.py                     # the issue's command, ESPN-0.2 and PackNet
    python benchmarks/whole_task.py --tasks 3 --train-per-task 1000 --epochs ''   # size rule on
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from step_cost import l2_term, plain_step
from torch import nn

from espn.api.experiment import build_benchmark
from espn.data.tasks import Task
from espn.runs.config import make_config

#: method names as the table prints them (a method with a FLOPs budget runs at gamma 0.2)
LABELS = {"espn": "ESPN-0.2"}


def espn_run(args: argparse.Namespace, method: str, out: Path) -> dict[str, Any]:
    """``espn run`` of ``method`` in a subprocess: its results.json and process seconds."""
    command = [sys.executable, "-m", "espn", "run", "--benchmark", args.benchmark]
    command += ["--method", method, "--tasks", str(args.tasks), "--out", str(out)]
    command += ["--train-per-task", str(args.train_per_task), "--seed", str(args.seed)]
    if args.test_per_task:
        command += ["--test-per-task", str(args.test_per_task)]
    if args.epochs:
        command += ["--epochs", args.epochs]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"espn run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads((out / "results.json").read_text())
    doc["process_s"] = seconds
    return doc


def plain_network(n_in: int, n_classes: int) -> nn.Module:
    """The dense FC1024 network of the MNIST-family benchmarks, as a user writes it."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(n_in, 1024),
        nn.ReLU(),
        nn.Linear(1024, 1024),
        nn.ReLU(),
        nn.Linear(1024, n_classes),
    )


def plain_task(
    task: Task, steps: int, batch: int, lr: float, seed: int, l2: float = 0.0
) -> tuple[float, float, float]:
    """Train a fresh plain network on ``task`` for ``steps`` RMSprop steps (passes over the
    data as needed), with the recipe's L2 term at strength ``l2`` where above 0, then
    evaluate it: (training seconds, test seconds, test accuracy %)."""
    torch.manual_seed(seed)
    x0, _ = next(task.batches("train", 2, augment=False))
    model = plain_network(x0[0].numel(), task.n_classes)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=lr)
    hidden = [m.weight for m in list(model)[1:-1] if isinstance(m, nn.Linear)]
    loop = (model, optimizer, l2_term(hidden, l2) if l2 > 0 else None)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    start, done = time.perf_counter(), 0
    loss = torch.zeros(())
    while done < steps:
        for x, y in task.batches("train", batch, True, generator):
            if done == steps:
                break
            loss = plain_step(loop, x, y)
            done += 1
    float(loss.detach())  # wait for the device, as espn's epoch does
    trained = time.perf_counter()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in task.batches("test", 1000):
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return trained - start, time.perf_counter() - trained, 100.0 * correct / max(total, 1)


def task_steps(doc: dict[str, Any]) -> list[int]:
    """Optimizer steps espn's run took on each task (all phases)."""
    return [sum(int(p["steps"]) for p in phases) for phases in doc["phases"]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="rotated-fashion-mnist")
    parser.add_argument("--methods", default="espn,packnet")
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--train-per-task", type=int, default=6000)
    parser.add_argument("--test-per-task", type=int, default=None)
    parser.add_argument(
        "--epochs", default="2,4,3", help="PRE,PRUNE,FINE ('' : the recipe's, size rule on)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None, help="dataset root (default: espn's)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of both")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    sizing: dict[str, Any] = {"tasks": args.tasks, "train_per_task": args.train_per_task}
    if args.test_per_task:
        sizing["test_per_task"] = args.test_per_task
    if args.data_dir:
        sizing["data_dir"] = args.data_dir
    print(
        f"{args.benchmark}, {args.tasks} task(s) x {args.train_per_task} training images, "
        f"epochs {args.epochs or 'of the recipe'}, {args.threads} thread(s), median of "
        f"{args.repeats} alternating run(s); seconds (espn / plain)"
    )
    print(
        f"{'method':>10} {'steps':>6} {'espn train':>10} {'plain train':>11} {'ratio':>6}"
        f" {'plain+L2':>8} {'ratio':>6}"
        f" {'espn run':>9} {'plain run':>9} {'ratio':>6} {'process':>8}"
        f" {'espn acc':>9} {'plain acc':>9}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        seq = None
        for method in args.methods.split(","):
            rows: list[tuple[float, float, float, float, float, float]] = []
            steps: list[int] = []
            accs: tuple[float, float] = (math.nan, math.nan)
            for repeat in range(args.repeats):
                doc = espn_run(args, method, Path(tmp) / f"{method}-{repeat}")
                cfg = make_config(benchmark=args.benchmark, method=method, out=tmp, **sizing)
                if seq is None:  # the same tasks as espn's (same images, order, transform)
                    seq = build_benchmark(cfg, download=False)
                steps = task_steps(doc)
                lr, batch = float(doc["config"]["lr"]), int(doc["config"]["batch_size"])
                plain = [
                    plain_task(task, n, batch, lr, args.seed)
                    for task, n in zip(seq.tasks, steps, strict=True)
                ]
                train = sum(p[0] for p in plain)
                l2 = float(doc["config"]["method_options"].get("masked_l2", 0.0))
                with_l2 = (
                    sum(
                        plain_task(task, n, batch, lr, args.seed, l2)[0]
                        for task, n in zip(seq.tasks, steps, strict=True)
                    )
                    if l2 > 0
                    else math.nan
                )
                rows.append(
                    (
                        float(sum(doc["seconds"])),
                        train,
                        float(doc["wall_time_s"]),
                        train + sum(p[1] for p in plain),
                        float(doc["process_s"]),
                        with_l2,
                    )
                )
                espn_acc = statistics.mean(doc["accuracy_matrix"][-1])
                accs = (espn_acc, statistics.mean(p[2] for p in plain))
            e_train, p_train, e_run, p_run, process, l2_train = (
                statistics.median(r[i] for r in rows) for i in range(6)
            )
            print(
                f"{LABELS.get(method, method):>10} {sum(steps):>6} {e_train:>10.1f}"
                f" {p_train:>11.1f} {e_train / p_train:>5.2f}x {l2_train:>8.1f}"
                f" {e_train / l2_train:>5.2f}x {e_run:>9.1f} {p_run:>9.1f}"
                f" {e_run / p_run:>5.2f}x {process:>8.1f} {accs[0]:>8.2f}% {accs[1]:>8.2f}%"
            )


if __name__ == "__main__":
    main()
