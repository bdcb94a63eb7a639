"""espn's training step against a plain PyTorch step, timed step by step.

``step_cost.py`` alternates an epoch of espn's steps with an epoch of the plain loop's; on a
machine shared with other work the load changes within an epoch, and a few steps per epoch
make its ratios move by 0.2 from run to run. Here every optimizer step of espn's task is
followed at once by one step of the plain loop (the same network as plain torch layers, the
same task's batches, the same optimizer: ``step_cost``'s), each timed on its own with this
process's CPU time, and each phase reports the median of the per-step ratios espn / plain
(the first ``--skip`` steps of a phase not counted). The plain step's time includes drawing
its batch, as espn's does; prune events are timed apart and left out, as in ``step_cost``.
The masked supernet trains (``slim_training`` off). Where the method's recipe has the L2 term
on the masked weights, a ``plain+L2`` step (``step_cost``'s second baseline: the same term in
the plain loss) follows too, and the method prints a row against each baseline.

``--control`` adds a third step after each espn step: a second copy of the plain network
with its own optimizer and batches, whose ``control`` row gives its per-step ratio to the
first, two identical steps timed the same way: the machine's noise floor.

    python benchmarks/step_pairs.py --threads 1 --models vit-p4 --methods espn,packnet --batch 32
    python benchmarks/step_pairs.py --threads 1 --models resnet18-reduced --batch 32 --control
    python benchmarks/step_pairs.py --threads 1 --reference  # the fast path off
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
from step_cost import (
    LABELS,
    SETTINGS,
    baseline_loops,
    check_same_network,
    plain_network,
    plain_optimizer,
    plain_step,
    synthetic_task,
)
from torch import Tensor

from espn import create_method
from espn.models.registry import ModelSpec, build_supernet
from espn.supernet import fast
from espn.training.callbacks import Callback, StepEnd
from espn.training.engine import Engine
from espn.training.optim import TaskOptimizer

CLOCK = time.process_time


#: per phase, each counted step's espn seconds and each baseline's seconds
Pairs = dict[str, list[tuple[float, dict[str, float]]]]


def measure(name: str, method: str, args: argparse.Namespace) -> Pairs:
    """Per phase of task 1 of ``method`` on model ``name``: (espn s, {baseline: s}) of each
    step."""
    setting = SETTINGS[name]
    batch = args.batch or setting.batch
    spec = ModelSpec(setting.shape, 10, setting.multi_head, stream_pruning="per-conv")
    supernet = build_supernet(setting.model, spec, torch.zeros(2, *setting.shape), 0, "cpu")
    plain = plain_network(supernet)
    probe = synthetic_task("probe", setting, 4, 99, "cpu")
    check_same_network(supernet, plain, next(probe.batches("train", 4, augment=False))[0], name)
    strategy = create_method(method, epochs=(1, 1, 1), warmup=0)
    loops = baseline_loops(supernet, plain, setting, float(strategy.settings.get("masked_l2", 0)))
    if args.control:
        twin = copy.deepcopy(plain)
        loops["control"] = (twin, plain_optimizer(setting.optim, list(twin.parameters())), None)
    engine = Engine(supernet, strategy, setting.optim, batch, seed=0, slim_training=False)
    engine.train_task(synthetic_task("task 0", setting, batch, 1, "cpu"), 0)
    task = synthetic_task("task 1", setting, batch * args.steps, 2, "cpu")

    def plain_batches() -> Iterator[tuple[Tensor, Tensor]]:
        generator = torch.Generator().manual_seed(3)
        while True:
            yield from task.batches("train", batch, True, generator)

    batches = {base: plain_batches() for base in loops}
    steps: Pairs = {}
    mark = [CLOCK()]
    prune_event = engine._prune_event

    def timed_prune_event(progress: float, optimizer: TaskOptimizer) -> None:
        start = CLOCK()
        prune_event(progress, optimizer)
        mark[0] += CLOCK() - start  # not counted in the step after it

    engine._prune_event = timed_prune_event  # type: ignore[method-assign]

    class PlainStep(Callback):
        """After each espn step: one step of each baseline, all timed."""

        def on_step_end(self, learner: Any, event: StepEnd) -> None:
            espn, base = CLOCK() - mark[0], {}
            for name, loop in loops.items():
                start = CLOCK()
                loss = plain_step(loop, *next(batches[name]))
                float(loss.detach())  # wait for the device, as espn's epoch does
                base[name] = CLOCK() - start
            steps.setdefault(event.phase, []).append((espn, base))
            mark[0] = CLOCK()

        def on_epoch_start(self, learner: Any, event: Any) -> None:
            mark[0] = CLOCK()

    engine.callbacks.append(PlainStep())
    engine.train_task(task, 1)
    return {phase: pairs[args.skip :] for phase, pairs in steps.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vit-p4")
    parser.add_argument("--methods", default="espn,packnet")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps per phase")
    parser.add_argument("--skip", type=int, default=2, help="first steps of a phase not counted")
    parser.add_argument("--batch", type=int, default=None, help="batch (default: the model's)")
    parser.add_argument(
        "--control", action="store_true", help="also time a plain step against a plain step"
    )
    parser.add_argument(
        "--reference", action="store_true", help="espn's reference step (fast path off)"
    )
    args = parser.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in SETTINGS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(SETTINGS)}")
    if args.skip < 0 or args.steps <= args.skip:
        parser.error("--steps must exceed --skip, and --skip be at least 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"cpu, {torch.get_num_threads()} threads, process CPU time, each espn step followed by "
        f"a plain step; median ms per step and median per-step ratio over {args.steps - args.skip}"
        " steps per phase"
    )
    print(
        f"{'model':>17} {'method':>10} {'batch':>5} {'baseline':>9} {'base ms':>8}"
        "  phases: espn ms (ratio)"
    )
    for name in args.models.split(","):
        for method in args.methods.split(","):
            with fast.enabled(not args.reference):
                phases = measure(name, method, args)
            batch = args.batch or SETTINGS[name].batch
            label = LABELS.get(method, method)
            for base in next(iter(phases.values()))[0][1]:
                # the control row times the plain twin against the plain step; the others
                # espn's step against their baseline
                who, against = ("control", "plain") if base == "control" else ("espn", base)
                base_ms = 1e3 * statistics.median(
                    b[against] for pairs in phases.values() for _, b in pairs
                )
                cells = "".join(
                    f"  {phase} {1e3 * statistics.median(timed(p, who) for p in pairs):.1f} "
                    f"({statistics.median(timed(p, who) / p[1][against] for p in pairs):.2f}x)"
                    for phase, pairs in phases.items()
                )
                print(f"{name:>17} {label:>10} {batch:>5} {base:>9} {base_ms:>8.1f}{cells}")


def timed(pair: tuple[float, dict[str, float]], who: str) -> float:
    """Seconds of ``who``'s step in one timed step: espn's, or a baseline's."""
    return pair[0] if who == "espn" else pair[1][who]


if __name__ == "__main__":
    main()
