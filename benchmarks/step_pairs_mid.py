"""espn's masked training step against a plain PyTorch step, timed in pairs in the middle of
each phase, with a control (plain against plain) for the machine's noise floor.

``step_cost.py`` alternates whole epochs of the two; on a shared machine a load that changes
between epochs moves its ratios by 5 to 10%. ``step_pairs.py`` follows each of the engine's
steps of a task by a plain step. This script takes extra pairs at one point of each phase,
and can time two plain networks against each other the same way (``--control``): in the
middle of each phase of task 1 (after a one-batch task 0, so that frozen weights exist) it
takes ``--pairs`` pairs of one espn step (the engine's own, with the phase's masks, penalty,
L2 term and guard) and one plain step (``step_cost.plain_network``: the same dense network
in plain torch layers, checked to compute the supernet's logits, with torch's optimizer) on the same batch, after two warm-up pairs,
and prints the median per-pair ratio, the ratio of the sums and the ratio of the fastest
steps. ``--control`` times a second plain network in espn's place instead: the ratios the
machine gives two identical steps (its noise floor).

The extra steps move the supernet's weights (the task goes on from there); the figures are
timings only. The masked supernet trains (``slim_training`` off).

    python benchmarks/step_pairs_mid.py --models resnet18-reduced --methods espn,packnet --pairs 12
    python benchmarks/step_pairs_mid.py --models resnet18-reduced --methods packnet --control
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from step_cost import (
    SETTINGS,
    check_same_network,
    plain_network,
    plain_optimizer,
    synthetic_task,
)
from torch import Tensor, nn

from espn.methods import create_method
from espn.models.registry import ModelSpec, build_supernet
from espn.training.engine import Engine
from espn.training.optim import FrozenGuard


def plain_step(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> Callable[[Tensor, Tensor], None]:
    """One plain PyTorch training step of ``model`` on a batch."""

    def step(x: Tensor, y: Tensor) -> None:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def pairs(
    first: Callable[[Tensor, Tensor], None],
    second: Callable[[Tensor, Tensor], None],
    batches: list[tuple[Tensor, Tensor]],
    n: int,
) -> tuple[list[float], list[float]]:
    """CPU seconds of ``n`` steps of each, alternated one by one (two warm-up pairs first)."""
    for x, y in batches[:2]:
        first(x, y)
        second(x, y)
    a, b = [], []
    for i in range(n):
        x, y = batches[i % len(batches)]
        start = time.process_time()
        first(x, y)
        a.append(time.process_time() - start)
        start = time.process_time()
        second(x, y)
        b.append(time.process_time() - start)
    return a, b


def measure(name: str, method: str, args: argparse.Namespace) -> None:
    """Print one line per phase of ``method`` on model ``name``."""
    setting = SETTINGS[name]
    batch = args.batch or setting.batch
    spec = ModelSpec(setting.shape, 10, setting.multi_head, stream_pruning="per-conv")
    supernet = build_supernet(setting.model, spec, torch.zeros(2, *setting.shape), 0, "cpu")
    plain = plain_network(supernet)
    probe = synthetic_task("probe", setting, 4, 99, "cpu")
    check_same_network(supernet, plain, next(probe.batches("train", 4, augment=False))[0], name)
    plain_opt = plain_optimizer(setting.optim, list(plain.parameters()))
    control = plain_network(supernet)
    control_opt = plain_optimizer(setting.optim, list(control.parameters()))
    strategy = create_method(method, epochs=(2, 2, 2), warmup=0)
    engine = Engine(supernet, strategy, setting.optim, batch, seed=0, slim_training=False)
    engine.train_task(synthetic_task("task 0", setting, batch, 1, "cpu"), 0)
    task = synthetic_task("task 1", setting, batch * 2, 2, "cpu")
    phases = {p.name: p for p in strategy.phases()}
    control.train()
    plain.train()

    def after_epoch(phase: str, epoch: int) -> None:
        if epoch != 1:  # the middle of the phase: its second epoch's end
            return
        optimizer = engine.build_optimizer()
        guard = FrozenGuard(supernet, restore=optimizer.decays)
        gen = torch.Generator().manual_seed(5)
        batches = list(task.batches("train", batch, True, gen))

        def espn_step(x: Tensor, y: Tensor) -> None:
            engine._step(optimizer, guard, phases[phase], x, y, setting.optim.lr, None)

        first = plain_step(control, control_opt) if args.control else espn_step
        a, b = pairs(first, plain_step(plain, plain_opt), batches, args.pairs)
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        label = "plain (control)" if args.control else "espn"
        print(
            f"{name:>17} {method:>8} {phase:>9}  {label} {1e3 * statistics.median(a):7.1f} ms, "
            f"plain {1e3 * statistics.median(b):7.1f} ms: median ratio "
            f"{statistics.median(ratios):.3f}, sum ratio {sum(a) / sum(b):.3f}, fastest ratio "
            f"{min(a) / min(b):.3f}",
            flush=True,
        )

    engine.train_task(task, 1, on_epoch_end=after_epoch)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18-reduced,mobilenetv2-small")
    parser.add_argument("--methods", default="espn,packnet")
    parser.add_argument("--batch", type=int, default=32, help="batch (0: the model's)")
    parser.add_argument("--pairs", type=int, default=12, help="timed pairs per phase")
    parser.add_argument("--control", action="store_true", help="plain against plain")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in SETTINGS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(SETTINGS)}")
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    torch.set_num_threads(1)
    print(f"cpu, 1 thread, CPU time, {args.pairs} pairs per phase, batch {args.batch or 'model'}")
    for name in args.models.split(","):
        for method in args.methods.split(","):
            measure(name, method, args)


if __name__ == "__main__":
    main()
