"""The benchmark registry: every benchmark is built from the same :class:`BenchmarkArgs`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import torch

from espn.data.tasks import TaskSequence
from espn.registry import Registry


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


class RunDefaults(TypedDict, total=False):
    """A benchmark's values for the run options left out (its recipe); ``regime`` names
    the family of recipes a method's own recipe is chosen from (``"mnist"``: FC networks on
    28x28 digits, ``"cifar"``: ResNets on images; see ``Strategy.recipe``)."""

    regime: str
    model: str
    alpha: float
    optimizer: str
    betas: tuple[float, float]
    weight_decay: float
    momentum: float
    lr: float
    batch_size: int
    epochs: tuple[int, int, int]
    warmup: int
    finetune_lr: float
    finetune_schedule: str
    #: training images per task that the recipe's epochs are stated for (the size rule's
    #: reference, see ``RunConfig.reference_size``)
    reference_size: int


@dataclass(frozen=True)
class Benchmark:
    """A named benchmark: how to build it, its task count limits, and its run defaults."""

    build: Callable[[BenchmarkArgs], TaskSequence]
    default_tasks: int
    max_tasks: int | None
    description: str
    defaults: RunDefaults = field(default_factory=lambda: RunDefaults())
    needs_folders: bool = False  # its tasks come from the --folders directories
    #: how classes may be dealt to tasks (split benchmarks; the first is the default)
    class_orders: tuple[str, ...] = ()


BENCHMARKS: Registry[Benchmark] = Registry("benchmark")
#: the recipe of each data regime (``mnist``: FC networks on small images; ``cifar``: conv
#: networks), for data of no registered benchmark (a Python user's own tensors)
REGIMES: Registry[RunDefaults] = Registry("recipe regime")


def task_generator(seed: int, task: int, salt: int = 0) -> torch.Generator:
    """A generator for task-level randomness that is fixed by (seed, task)."""
    return torch.Generator().manual_seed(1_000_003 * seed + 7919 * task + salt)
