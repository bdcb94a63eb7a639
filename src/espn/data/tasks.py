"""Tasks as tensors on the training device, and sequences of them."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import torch
from torch import Tensor

from espn.utils.transforms import BatchTransform


@dataclass
class Split:
    """The samples of one split: ``x[index[i]]`` has label ``y[i]``; ``x`` may be shared."""

    x: Tensor
    index: Tensor
    y: Tensor

    def __len__(self) -> int:
        return int(self.index.numel())


@dataclass
class Task:
    """One task: its train and test samples, how to turn raw samples into inputs, its classes."""

    name: str
    train: Split
    test: Split
    transform: BatchTransform
    n_classes: int

    def split(self, name: str) -> Split:
        """The ``train`` or ``test`` split."""
        if name not in ("train", "test"):
            raise ValueError(f"unknown split {name!r}; choose 'train' or 'test'")
        return self.train if name == "train" else self.test

    def batches(
        self,
        split: str,
        batch_size: int,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
        augment: bool | None = None,
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield ``(inputs, labels)`` batches on the data's device; ``augment`` (default: on
        for the training split) applies the training transform."""
        data = self.split(split)
        train = split == "train" if augment is None else augment
        rows = self.batch_rows(split, batch_size, shuffle, generator, data.index.device)
        for r, x in zip(rows, self.inputs(split, rows, train), strict=True):
            yield x, data.y[r]

    def inputs(self, split: str, rows: list[Tensor], train: bool) -> Iterator[Tensor]:
        """The model inputs of each batch of ``rows`` of ``split`` (what a kind of task that
        loads or transforms its samples otherwise replaces)."""
        data = self.split(split)
        return (self.transform(data.x[data.index[r]], train) for r in rows)

    def raw_inputs(self, split: str, batch_size: int) -> list[Tensor]:
        """The samples of ``split`` as stored, before the transform (raw images), in batches
        of ``batch_size`` in order: what an exported task takes (see ``espn.export``)."""
        data = self.split(split)
        rows = self.batch_rows(split, batch_size, device=data.index.device)
        return [data.x[data.index[r]] for r in rows]

    def batch_rows(
        self,
        split: str,
        batch_size: int,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ) -> list[Tensor]:
        """The rows of ``split`` in each batch, in order (shuffled by ``generator``), on
        ``device``; the one place that decides batch order, so every task kind agrees."""
        n = len(self.split(split))
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        return list(order.to(device).split(batch_size))

    def num_batches(self, split: str, batch_size: int) -> int:
        """Batches per pass over ``split`` (the last one may be short)."""
        return -(-len(self.split(split)) // batch_size)


class LazyTasks(Sequence[Task]):
    """``n`` tasks built on use by ``build(t)``, the ``keep`` most recently used held.

    A long sequence then holds what builds a task (e.g. its permutation), not every task's
    index tensors: memory stays bounded however many tasks a run has.
    """

    def __init__(self, n: int, build: Callable[[int], Task], keep: int = 4) -> None:
        self.n, self.build, self.keep = n, build, keep
        self._cache: OrderedDict[int, Task] = OrderedDict()
        self._names: dict[int, str] = {}

    def name(self, t: int) -> str:
        """Task ``t``'s name, remembered once built (names are all a run's records need)."""
        return self._names[t] if t in self._names else self[t].name

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> Task: ...

    @overload
    def __getitem__(self, i: slice) -> list[Task]: ...

    def __getitem__(self, i: int | slice) -> Task | list[Task]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        t = i + self.n if i < 0 else i
        if not 0 <= t < self.n:
            raise IndexError(f"task {i} out of range for {self.n} tasks")
        task = self._cache.pop(t, None) or self.build(t)
        self._cache[t] = task
        self._names[t] = task.name
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return task


@dataclass
class TaskSequence:
    """A benchmark instance: the tasks in training order and what a model needs to know."""

    name: str
    tasks: Sequence[Task]
    input_shape: tuple[int, ...]
    multi_head: bool
    info: dict[str, object] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tasks)

    def names(self, n: int | None = None) -> list[str]:
        """Names of the first ``n`` tasks (all by default), without building lazy tasks anew."""
        count = len(self.tasks) if n is None else min(n, len(self.tasks))
        if isinstance(self.tasks, LazyTasks):
            return [self.tasks.name(t) for t in range(count)]
        return [t.name for t in self.tasks[:count]]

    @property
    def n_classes(self) -> int:
        """The largest class count of any task (the width of a shared head)."""
        return max(t.n_classes for t in self.tasks)


def subset_index(n: int, keep: int | None, generator: torch.Generator) -> Tensor:
    """A seeded random subset of ``keep`` indices out of ``n`` (all of them when None)."""
    if keep is None or keep >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=generator)[:keep].sort().values


def reordered(seq: TaskSequence, order: list[int]) -> TaskSequence:
    """``seq`` with its tasks in ``order`` (a permutation of the given positions)."""
    if sorted(order) != list(range(len(seq))):
        raise ValueError(f"task order {order} is not a permutation of 0..{len(seq) - 1}")
    given = seq.tasks
    tasks: Sequence[Task] = (
        LazyTasks(len(order), lambda t: given.build(order[t]), given.keep)
        if isinstance(given, LazyTasks)
        else [given[i] for i in order]
    )
    return TaskSequence(
        seq.name, tasks, seq.input_shape, seq.multi_head, {**seq.info, "given_positions": order}
    )


def prepended(first: TaskSequence, keep: int, seq: TaskSequence) -> TaskSequence:
    """The first ``keep`` tasks of ``first`` followed by the tasks of ``seq``."""
    if keep > len(first):
        raise ValueError(f"cannot keep {keep} tasks of a sequence of {len(first)}")
    head, tail = first.tasks, seq.tasks
    n = keep + len(seq)

    def build(t: int) -> Task:
        return head[t] if t < keep else tail[t - keep]

    tasks: Sequence[Task] = (
        LazyTasks(n, build)
        if isinstance(head, LazyTasks) or isinstance(tail, LazyTasks)
        else [build(t) for t in range(n)]
    )
    info = {**seq.info, "inherited_tasks": keep, "inherited_from": first.name}
    return TaskSequence(seq.name, tasks, seq.input_shape, seq.multi_head, info)
