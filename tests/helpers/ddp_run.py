"""One small continual run through ``ContinualLearner``, run alone or under ``torchrun``:
three tasks of pixel-permuted scikit-learn digits (real 8x8 images) on a small CNN with
BatchNorm. Each rank writes what the tests compare to ``REPORT_DIR/rank-R.json``: the digest
of its supernet, its accuracy matrix, the owner ids, masks and frozen weights after each task.

``python ddp_run.py METHOD OUT REPORT_DIR [--stop-after-steps N] [--tasks T] [--threads K]
[--shards S]``
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn

import espn
from espn.training.callbacks import Callback, StepEnd
from espn.training.distributed import digest

#: the options every run here shares (a global batch of 32)
SETTINGS = {"epochs": (1, 2, 1), "batch_size": 32, "seed": 3}
#: per method, what lets 3 tasks fit the small network: RMN's relevance threshold keeps
#: nearly every free weight on a short run, CPG's compacting rounds need this accuracy
OWN = {"rmn": {"rmn_budget": 0.3}, "cpg": {"cpg_train_acc": 50.0}}


class DigitsCNN(nn.Module):
    """Two convolutions with BatchNorm and a linear head, for 8x8 digits."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * 16, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def digits_tasks(n_tasks: int) -> list[tuple[tuple[torch.Tensor, torch.Tensor], ...]]:
    """``n_tasks`` pixel permutations of the digits (task 0 unpermuted), 1400 train images."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    tasks = []
    for t in range(n_tasks):
        perm = torch.arange(64) if t == 0 else torch.randperm(64, generator=g)
        images = x[:, perm].reshape(-1, 1, 8, 8)
        tasks.append(((images[:1400], y[:1400]), (images[1400:], y[1400:])))
    return tasks


def state_of(learner: espn.ContinualLearner) -> dict:
    """Owner ids, each task's weight masks, and the weights (as lists) of the supernet now."""
    sn = learner.supernet
    return {
        "owners": {n: ids.tolist() for n, ids in sn.owners.ids.items()},
        "weights": {n: layer.weight.detach().flatten().tolist() for n, layer in sn.layers.items()},
        "masks": [
            {n: m.weight_mask(n).flatten().int().tolist() for n in sn.layers} for m in sn.masks
        ],
    }


class Dying(Callback):
    """A kill: the process dies as its ``steps``-th optimizer step ends."""

    def __init__(self, steps: int) -> None:
        self.steps, self.done = steps, 0

    def on_step_end(self, learner: object, event: StepEnd) -> None:
        self.done += 1
        if self.done == self.steps:
            os._exit(17)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("method")
    parser.add_argument("out")
    parser.add_argument("report_dir")
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--stop-after-steps", type=int, default=0)
    parser.add_argument("--no-distributed", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--shards", type=int, default=None, help="slices of each batch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sn = espn.wrap(DigitsCNN(), torch.zeros(2, 1, 8, 8))
    learner = espn.ContinualLearner(
        sn,
        args.method,
        out=args.out,
        distributed=not args.no_distributed,
        callbacks=[Dying(args.stop_after_steps)] if args.stop_after_steps else [],
        shards=args.shards,
        **SETTINGS,
        **OWN.get(args.method, {}),
    )
    tasks = digits_tasks(args.tasks)
    states = []
    if args.method == "mtl":
        learner.learn_all(tasks)
        states.append(state_of(learner))
    else:
        for train, test in tasks:
            learner.learn(train, test)
            states.append(state_of(learner))
    learner.close()
    rank = learner.ranks.rank if learner.ranks is not None else 0
    world = learner.ranks.world if learner.ranks is not None else 1
    report = {
        "rank": rank,
        "world": world,
        "digest": digest(sn),
        "accuracy": learner.accuracy_matrix,
        "states": states,
    }
    Path(args.report_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.report_dir) / f"rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
