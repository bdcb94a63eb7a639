"""Where a run with slim training and the same run without it part (docs/performance.md,
"Slim and masked runs are two float paths").

Runs ``espn.run`` twice in this process, with and without ``slim_training``, and records the
weights before every prune event and the masks after it; prints, per event, the largest
difference between the two runs' weights and how many unit and weight-mask entries they
decided otherwise, then both runs' final accuracies and slim steps. Nothing is timed.

    python benchmarks/slim_paths.py --tasks 2 --train-per-task 3000 --epochs 1,3,2
    python benchmarks/slim_paths.py --tasks 2 --train-per-task 3000 --epochs 1,3,2 \\
        --optimizer sgd --lr 0.05
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

import espn
from espn.training.engine import Engine

Event = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]


def run(slim: bool, out: Path, options: dict[str, Any]) -> tuple[list[Event], dict[str, Any]]:
    """One run; per prune event, the weights before it and the unit and weight masks after."""
    events: list[Event] = []
    real = Engine._prune_event

    def recorded(self: Engine, progress: float, optimizer: Any) -> None:
        sn = self.supernet
        before = {n: layer.weight.detach().clone() for n, layer in sn.layers.items()}
        real(self, progress, optimizer)
        after = {f"units {g}": m.clone() for g, m in sn.unit_masks().items()}
        after |= {f"mask {n}": m.clone() for n, m in sn.weight_masks().items()}
        events.append((before, after))

    Engine._prune_event = recorded  # type: ignore[method-assign]
    try:
        doc = espn.run(out=out, slim_training=slim, progress=False, **options)
    finally:
        Engine._prune_event = real  # type: ignore[method-assign]
    return events, doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmark", default="permuted-fashion-mnist")
    parser.add_argument("--data-dir", default="/usr/share/datasets")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--train-per-task", type=int, default=3000)
    parser.add_argument("--test-per-task", type=int, default=256)
    parser.add_argument("--epochs", default="1,3,2")
    parser.add_argument("--optimizer", default=None)
    parser.add_argument("--lr", type=float, default=None)
    args = parser.parse_args()
    options: dict[str, Any] = {
        "benchmark": args.benchmark,
        "data_dir": args.data_dir,
        "tasks": args.tasks,
        "train_per_task": args.train_per_task,
        "test_per_task": args.test_per_task,
        "epochs": tuple(int(e) for e in args.epochs.split(",")),
    }
    options |= {k: v for k, v in (("optimizer", args.optimizer), ("lr", args.lr)) if v}
    with tempfile.TemporaryDirectory() as tmp:
        slim, slim_doc = run(True, Path(tmp) / "slim", options)
        masked, masked_doc = run(False, Path(tmp) / "masked", options)
    print("event  weights max |slim - masked| before it  entries decided otherwise")
    for k, ((w_slim, d_slim), (w_masked, d_masked)) in enumerate(zip(slim, masked, strict=True)):
        apart = max(float((w_slim[n] - w_masked[n]).abs().max()) for n in w_slim)
        other = sum(int((d_slim[n] != d_masked[n]).sum()) for n in d_slim)
        print(f"{k + 1:5d}  {apart:.3g}  {other}")
    for name, doc in (("slim", slim_doc), ("masked", masked_doc)):
        steps = sum(p["slim_steps"] for task in doc["phases"] for p in task)
        accuracy = ", ".join(f"{a:.2f}" for a in doc["final_accuracy"])
        print(f"{name}: final accuracy {accuracy}; {steps} steps on slim copies")


if __name__ == "__main__":
    main()
