"""The task-agnostic table of docs/task-agnostic.md: every rule on real runs.

For each sequence (rotated and permuted Fashion-MNIST, 10 tasks; split Fashion-MNIST, 5 tasks
of 2 classes; scikit-learn's handwritten digits, 5 tasks of 2 classes) and method (ESPN-0.2,
PackNet, SupSup) it trains one run with the ``task_agnostic`` option (``--off``: without it)
unless OUT/<sequence>-<method>[-off] already holds a finished one (a killed one is resumed),
by the size rule (``--epochs``/``--digits-epochs``: those epochs, the size rule off):
Fashion-MNIST through ``espn run`` on FC1024 with every training and test image of each task
(``--train``/``--test``: that many), the digits through ``espn.ContinualLearner`` on
an MLP 64-256-256.
Then it recomputes every task's statistics as this espn stores them when a task commits,
evaluates every task-inference rule the run can use on the tasks' test data
(``espn.inference.evaluate_named``) and prints one markdown row per run and rule (the run's
default in bold): accuracy with the task given, task-agnostic accuracy per sample and per
batch of 32, the task picked right (per sample), routing FLOPs per sample in dense passes (the
sum of the tasks' FLOPs ratios for a rule that runs every sub-network), the statistics stored
per task. A rule a run cannot use (SupSup's one-shot on ESPN, ``input-subspace`` without the
option) is left out.

    python benchmarks/task_agnostic_table.py --out runs/agnostic --data-dir DIR
    python benchmarks/task_agnostic_table.py --out runs/agnostic --data-dir DIR --off --methods espn
    python benchmarks/task_agnostic_table.py --out runs/short --data-dir DIR --epochs 1,1,1 \
        --digits-epochs 3,2,3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SEQUENCES = {
    "rotated-fashion-mnist": 10,
    "permuted-fashion-mnist": 10,
    "split-fashion-mnist": 5,
    "split-digits": 5,
}
METHODS = {"espn": {"gamma": 0.2}, "packnet": {}, "supsup": {}}


def _flags(settings: dict[str, Any]) -> list[str]:
    return [f for k, v in settings.items() for f in (f"--{k.replace('_', '-')}", str(v))]


def train_fashion(run: Path, sequence: str, method: str, option: bool, args: Any) -> None:
    """One ``espn run`` on Fashion-MNIST (FC1024), continuing a killed one in ``run``."""
    command = [
        sys.executable, "-c", "from espn.cli.main import app; app()", "run",
        "--benchmark", sequence, "--method", method, "--model", "fc1024",
        "--tasks", str(SEQUENCES[sequence]),
        *(["--epochs", args.epochs, "--no-step-floor"] if args.epochs else []),
        *(["--train-per-task", str(args.train)] if args.train else []),
        *(["--test-per-task", str(args.test)] if args.test else []),
        "--no-progress", "--quiet", "--out", str(run),
        "--resume" if (run / "checkpoint").is_dir() else "--overwrite",
        "--task-agnostic" if option else "--no-task-agnostic",
        *(["--data-dir", str(args.data_dir)] if args.data_dir else []),
        "--device", args.device,
        *_flags(METHODS[method]),
    ]  # fmt: skip
    print(" ".join(command[3:]), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def digits_tasks() -> list[tuple[Any, Any]]:
    """scikit-learn's 8x8 digits in 5 tasks of 2 classes (0-1, 2-3, ...), every third image
    of a task kept for its test set; pixels scaled to [0, 1]."""
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(digits.target)
    tasks = []
    for t in range(5):
        rows = ((y == 2 * t) | (y == 2 * t + 1)).nonzero().flatten()
        test = torch.arange(len(rows)) % 3 == 0
        xs, ys = x[rows], y[rows] - 2 * t
        tasks.append(((xs[~test], ys[~test]), (xs[test], ys[test])))
    return tasks


def train_digits(method: str, option: bool, args: Any) -> tuple[Any, list[Any], bool]:
    """One ``ContinualLearner`` on the digits (MLP 64-256-256, a head per task; seconds,
    trained anew every time): its supernet, its tasks, the option."""
    import torch
    from torch import nn

    import espn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
        nn.Linear(256, 2),
    )  # fmt: skip
    given: dict[str, Any] = {}  # the size rule
    if args.digits_epochs:
        given = {
            "epochs": tuple(int(e) for e in args.digits_epochs.split(",")),
            "step_floor": False,
        }
    learner = espn.ContinualLearner(
        espn.wrap(model, torch.zeros(2, 1, 8, 8)), method, task_agnostic=option, **given,
        **METHODS[method],
    )  # fmt: skip
    for train, test in digits_tasks():
        learner.learn(train, test=test)
    return learner.supernet, learner.tasks, option


def finished(run: Path) -> bool:
    """Whether ``run`` holds a finished ``espn run`` (its results.json says it is complete;
    a killed run's says not)."""
    results = run / "results.json"
    return results.is_file() and json.loads(results.read_text()).get("complete") is True


def load_fashion(run: Path) -> tuple[Any, list[Any], bool]:
    """A finished ``espn run``: its supernet, its tasks, whether it ran with the option."""
    from espn.runs.building import build_benchmark
    from espn.runs.loading import load_run

    loaded = load_run(run, "cpu")
    seq = build_benchmark(loaded.config, download=False)
    tasks = [seq.tasks[t] for t in range(loaded.n_tasks)]
    return loaded.supernet, tasks, bool(loaded.config.task_agnostic)


def evaluate(supernet: Any, tasks: list[Any], option: bool) -> list[dict[str, Any]]:
    """Every rule the run can use, on its tasks' test data."""
    from espn.inference import evaluate_named, routing

    for t, task in enumerate(tasks):  # as this espn stores them when a task commits
        supernet.masks[t].stats = routing.statistics(supernet, t, task, option)
    return evaluate_named(supernet, tasks, "all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/agnostic"))
    parser.add_argument("--train", type=int, help="training images per task (unset: all)")
    parser.add_argument("--test", type=int, help="test images per task (unset: all)")
    parser.add_argument(
        "--epochs", help="Fashion-MNIST's per phase, as given (size rule off); unset: the size rule"
    )
    parser.add_argument(
        "--digits-epochs", help="the digits' per phase, as given; unset: the size rule"
    )
    parser.add_argument("--sequences", default=",".join(SEQUENCES))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--off", action="store_true", help="runs without the option")
    parser.add_argument("--data-dir", type=Path, help="where Fashion-MNIST is")
    parser.add_argument("--device", default="cpu", help="where espn run trains (cpu, cuda)")
    parser.add_argument("--train-only", action="store_true", help="train, evaluate nothing")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()

    print("| sequence | method | option | rule | task given | per sample | per batch of 32 | "
          "task picked right | routing FLOPs (dense passes) | stored per task (KiB) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    figures = []
    for sequence in args.sequences.split(","):
        for method in args.methods.split(","):
            run = args.out / f"{sequence}-{method}{'-off' if args.off else ''}"
            if sequence == "split-digits":
                if args.train_only:
                    continue
                learned = train_digits(method, not args.off, args)
            else:
                if not finished(run):
                    train_fashion(run, sequence, method, not args.off, args)
                if args.train_only:
                    continue
                learned = load_fashion(run)
            for doc in evaluate(*learned):
                avg = doc["average"]
                kib = sum(doc["statistics_bytes"]) / len(doc["statistics_bytes"]) / 1024
                rule = f"**{doc['rule']}**" if doc["default"] else doc["rule"]
                figures.append({"sequence": sequence, "method": method} | doc)
                print(
                    f"| {sequence} | {method} | {'off' if args.off else 'on'} | {rule} | "
                    f"{avg['given']:.2f} | {avg['per_sample']:.2f} | {avg['per_batch']:.2f} | "
                    f"{avg['task_picked']:.2f} | {doc['flops_passes']:.2f} | {kib:.1f} |",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
