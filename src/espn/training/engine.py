"""The training engine: one loop that every method drives through its strategy hooks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from espn.data.tasks import Task
from espn.methods.base import Phase, Strategy
from espn.supernet.layers import UnitModule
from espn.supernet.supernet import Supernet
from espn.training.optim import FrozenGuard, OptimConfig, build_optimizer, cosine_factor


@dataclass
class TaskLog:
    """What happened while training one task."""

    seconds: float
    epochs: int
    seconds_per_epoch: float
    final_loss: float


def prune_points(n_iters: int, n_updates: int) -> list[int]:
    """Iterations (1-based, after which) the ``n_updates`` prune steps of a phase happen."""
    if n_updates <= 0:
        return []
    return [max(0, (k * n_iters) // n_updates) for k in range(1, n_updates + 1)]


class Engine:
    """Trains tasks one after another into a supernet with a given strategy."""

    def __init__(
        self,
        supernet: Supernet,
        strategy: Strategy,
        optim: OptimConfig,
        batch_size: int,
        seed: int = 0,
        progress: bool = True,
    ) -> None:
        self.supernet = supernet
        self.strategy = strategy
        self.optim = optim
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.progress = progress

    def _trainable(self) -> list[torch.nn.Parameter]:
        params = list(self.supernet.shared_parameters())
        for module in self.supernet.task_modules.values():
            if isinstance(module, UnitModule) and not self.strategy.train_unit_affine:
                continue
            params += list(module.parameters())
        return params

    def train_task(
        self,
        task: Task,
        index: int,
        on_epoch_end: Callable[[str, int], None] | None = None,
    ) -> TaskLog:
        """Train ``task`` as task number ``index`` and commit its sub-network."""
        sn, strategy = self.supernet, self.strategy
        sn.begin_task(task.n_classes)
        strategy.begin_task(sn)
        guard = FrozenGuard(sn)
        optimizer = build_optimizer(self.optim, self._trainable())
        phases = strategy.phases()
        per_epoch = task.num_batches("train", self.batch_size)
        total = sum(p.epochs for p in phases) * per_epoch
        start, loss_value, epochs_done = time.perf_counter(), torch.tensor(float("nan")), 0
        bar = tqdm(
            total=total,
            desc=f"task {index + 1}",
            disable=None if self.progress else True,
            leave=False,
        )
        sn.train()
        for phase in phases:
            n_iters = phase.epochs * per_epoch
            points = prune_points(n_iters, phase.prune_updates)
            done = 0
            while done < len(points) and points[done] == 0:
                done += 1
                strategy.prune_step(sn, done / len(points))
            step = 0
            for epoch in range(phase.epochs):
                bar.set_description(f"task {index + 1} {phase.name} {epoch + 1}/{phase.epochs}")
                for x, y in task.batches("train", self.batch_size, True, self.generator):
                    loss_value = self._step(optimizer, guard, phase, x, y, step, n_iters)
                    step += 1
                    while done < len(points) and points[done] == step:
                        done += 1
                        strategy.prune_step(sn, done / len(points))
                    bar.update(1)
                bar.set_postfix(loss=f"{float(loss_value):.3f}")
                epochs_done += 1
                if on_epoch_end is not None:
                    on_epoch_end(phase.name, epoch)
        bar.close()
        sn.eval()
        sn.commit_task()
        seconds = time.perf_counter() - start
        return TaskLog(seconds, epochs_done, seconds / max(epochs_done, 1), float(loss_value))

    def _step(
        self,
        optimizer: torch.optim.Optimizer,
        guard: FrozenGuard,
        phase: Phase,
        x: torch.Tensor,
        y: torch.Tensor,
        step: int,
        n_iters: int,
    ) -> torch.Tensor:
        lr = self.optim.lr * (cosine_factor(step, n_iters) if phase.cosine else 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = F.cross_entropy(self.supernet(x), y)
        total = loss
        if phase.regularise:
            penalty = self.strategy.penalty(self.supernet)
            if penalty is not None:
                total = loss + penalty
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        guard.mask_gradients()
        optimizer.step()
        guard.restore()
        return loss.detach()
