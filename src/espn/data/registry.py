"""The benchmark registry: every benchmark is built from the same :class:`BenchmarkArgs`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from espn.data.tasks import TaskSequence
from espn.registry import Registry
from espn.settings.recipes import Recipe


@dataclass(frozen=True)
class BenchmarkArgs:
    """The one constructor signature of all benchmarks."""

    n_tasks: int | None = None
    #: the task-sequence seed: permutations, rotation order, class order, per-task subsets
    seed: int = 0
    train_per_task: int | None = None
    test_per_task: int | None = None
    data_dir: Path | None = None
    device: torch.device | str = "cpu"
    download: bool = True
    folders: tuple[Path, ...] = ()  # image-folders: one directory per task
    image_size: int | None = None  # image-folders: side of the square images
    class_order: str | None = None  # split benchmarks: one of the benchmark's class_orders
    #: training images of each task (``--train-sizes``); overrides ``train_per_task``
    train_sizes: tuple[int, ...] | None = None

    def train_keep(self, task: int) -> int | None:
        """Training images to keep for task ``task`` (None: all of them)."""
        if self.train_sizes is not None and task < len(self.train_sizes):
            return self.train_sizes[task]
        return self.train_per_task


@dataclass(frozen=True)
class Benchmark:
    """A named benchmark: how to build it, its task count limits, and its recipe (one of
    :mod:`espn.settings.recipes`)."""

    build: Callable[[BenchmarkArgs], TaskSequence]
    default_tasks: int
    max_tasks: int | None
    description: str
    defaults: Recipe = field(default_factory=Recipe)
    needs_folders: bool = False  # its tasks come from the --folders directories
    #: how classes may be dealt to tasks (split benchmarks; the first is the default)
    class_orders: tuple[str, ...] = ()


BENCHMARKS: Registry[Benchmark] = Registry("benchmark")


def task_generator(seed: int, task: int, salt: int = 0) -> torch.Generator:
    """A generator for task-level randomness that is fixed by (seed, task)."""
    return torch.Generator().manual_seed(1_000_003 * seed + 7919 * task + salt)
