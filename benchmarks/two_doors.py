"""The same tasks through both front doors: ``espn run`` (``espn.api.experiment``) and the Python
learner fed the benchmark's tensors, each with its defaults, and the wall time of each.

The learner is given the benchmark's recipe (``recipe=BENCHMARK``, what ``espn run`` uses)
and, for comparison, left to pick the recipe of its network's regime. With the same recipe
the two doors must print the same accuracies.

    python benchmarks/two_doors.py --benchmark permuted-fashion-mnist --tasks 3 \\
        --train-per-task 1000 --reference-size 5000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

import espn
from espn.api.experiment import build_benchmark, run_experiment
from espn.data.tensors import split_tensors
from espn.runs.config import make_config
from espn.training.callbacks import Callback, TaskEnd

DOORS = ("cli", "recipe", "own")


class TaskLine(Callback):
    """Prints each task's accuracy row and the time since the door opened, as it ends (a run
    cut short still says how far it got)."""

    def __init__(self, door: str, start: float) -> None:
        self.door, self.start = door, start

    def on_task_end(self, learner: object, event: TaskEnd) -> None:
        row = ", ".join(f"{a:.2f}" for a in event.row or [])
        seconds = time.perf_counter() - self.start
        print(f"{self.door}: task {event.task} done [{row}] at {seconds:.1f}s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="permuted-fashion-mnist")
    parser.add_argument("--method", default="espn")
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--train-per-task", type=int, default=1000)
    parser.add_argument("--test-per-task", type=int, default=1000)
    parser.add_argument(
        "--reference-size",
        type=int,
        default=None,
        help="the size rule's reference (default: the recipe's, 60000 for the MNIST family)",
    )
    parser.add_argument(
        "--doors",
        default=",".join(DOORS),
        help="which doors to run, comma-separated (one process per door runs them in parallel)",
    )
    args = parser.parse_args()
    doors = [d.strip() for d in args.doors.split(",") if d.strip()]
    unknown = sorted(set(doors) - set(DOORS))
    if unknown:
        parser.error(f"unknown door(s) {', '.join(unknown)}; choose from {', '.join(DOORS)}")
    sizing = {"tasks": args.tasks, "train_per_task": args.train_per_task}
    sizing["test_per_task"] = args.test_per_task
    rule = {} if args.reference_size is None else {"reference_size": args.reference_size}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_config(
            benchmark=args.benchmark, method=args.method, out=Path(tmp) / "cli", **sizing, **rule
        )
        results = {}
        if "cli" in doors:
            start = time.perf_counter()
            doc = run_experiment(cfg, progress=False)
            results["espn run"] = (doc["accuracy_matrix"][-1], time.perf_counter() - start)
        seq = build_benchmark(cfg)
        data = [(split_tensors(t, "train"), split_tensors(t, "test")) for t in seq.tasks]
        for door, label, recipe in (
            ("recipe", "learner, recipe=benchmark", args.benchmark),
            ("own", "learner, own", None),
        ):
            if door not in doors:
                continue
            torch.manual_seed(cfg.seed)
            sn = espn.wrap(
                str(cfg.model),
                data[0][0][0][:2],
                n_classes=seq.n_classes,
                multi_head=seq.multi_head,
            )
            start = time.perf_counter()
            learner = espn.ContinualLearner(
                sn, args.method, recipe=recipe, callbacks=[TaskLine(label, start)], **rule
            )
            learner.learn_all(data, names=[t.name for t in seq.tasks])
            results[label] = (learner.accuracy_matrix[-1], time.perf_counter() - start)
    print(f"{args.method} on {args.benchmark}, {args.tasks} tasks x {args.train_per_task} images")
    print("| door | final accuracies (%) | mean | wall time (s) |")
    print("|---|---|---|---|")
    for label, (row, seconds) in results.items():
        row = row or []
        mean = sum(row) / max(len(row), 1)
        cells = ", ".join(f"{a:.2f}" for a in row)
        print(f"| {label} | {cells} | {mean:.2f} | {seconds:.1f} |")
    if "espn run" in results and "learner, recipe=benchmark" in results:
        same = results["espn run"][0] == results["learner, recipe=benchmark"][0]
        print(f"espn run and the learner with the benchmark's recipe agree: {same}")


if __name__ == "__main__":
    main()
