"""Permuted and Rotated (Fashion-)MNIST: every task is a 10-class task over the same images."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from espn.data.registry import BENCHMARKS, Benchmark, BenchmarkArgs, task_generator
from espn.data.sources import load_mnist_like
from espn.data.tasks import LazyTasks, Split, Task, TaskSequence, subset_index
from espn.settings.recipes import MNIST
from espn.utils.transforms import BatchTransform

#: most tasks of a permuted benchmark: every task adds its masks to the checkpoint and is
#: evaluated after every later one (quadratic time), so longer sequences are refused
MAX_PERMUTED_TASKS = 1000
NORMALISATION = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530)}


def _to_unit(x: Tensor) -> Tensor:
    return x.unsqueeze(1).float().div_(255.0)


def _normalise(x: Tensor, source: str) -> Tensor:
    mean, std = NORMALISATION[source]
    return (x - mean) / std


def permute_pixels(x: Tensor, train: bool, perm: Tensor, source: str) -> Tensor:
    """uint8 [B, 28, 28] -> normalised [B, 1, 28, 28] with the task's pixel permutation."""
    flat = _normalise(_to_unit(x), source).flatten(1)[:, perm]
    return flat.view(-1, 1, *x.shape[1:])


def rotate_images(x: Tensor, train: bool, angle: float, source: str) -> Tensor:
    """uint8 [B, 28, 28] -> normalised [B, 1, 28, 28] rotated by ``angle`` degrees."""
    import torchvision.transforms.v2.functional as TF  # importing torchvision costs seconds

    rotated = TF.rotate(_to_unit(x), angle, interpolation=TF.InterpolationMode.BILINEAR)
    return _normalise(rotated, source)


def _base_splits(source: str, args: BenchmarkArgs) -> dict[str, tuple[Tensor, Tensor]]:
    raw = load_mnist_like(source, args.data_dir, args.download)
    return {s: (x.to(args.device), y.to(args.device)) for s, (x, y) in raw.items()}


def _task(base: dict, args: BenchmarkArgs, t: int, name: str, transform: BatchTransform) -> Task:
    """Task ``t``, a 10-class task over seeded subsets of ``base``'s images."""
    splits = []
    for salt, (split, keep) in enumerate(
        (("train", args.train_keep(t)), ("test", args.test_per_task))
    ):
        x, y = base[split]
        if keep is None or keep >= len(y):  # every image: one index shared by all tasks
            every = Split(x, torch.arange(len(y), device=x.device), y)
            splits.append(base.setdefault(f"all-{split}", every))
        else:
            index = subset_index(len(y), keep, task_generator(args.seed, t, salt)).to(x.device)
            splits.append(Split(x, index, y[index]))
    return Task(name, splits[0], splits[1], transform, 10)


def _seq(name: str, tasks: Sequence[Task], kind: str, **info: object) -> TaskSequence:
    return TaskSequence(name, tasks, (1, 28, 28), multi_head=False, info={"kind": kind, **info})


def permuted(source: str, name: str, args: BenchmarkArgs) -> TaskSequence:
    """Task t permutes the pixels with its own permutation drawn from the seed."""
    n_tasks = args.n_tasks or 36  # at most MAX_PERMUTED_TASKS: RunConfig refuses more
    base = _base_splits(source, args)
    gen = torch.Generator().manual_seed(args.seed)
    # 1.5 KiB per task; its index tensors and transform are made when the task is used
    perms = torch.stack([torch.randperm(28 * 28, generator=gen) for _ in range(n_tasks)])
    perms = perms.to(torch.int16)

    def build(t: int) -> Task:
        perm = perms[t].to(args.device, torch.long)
        transform = functools.partial(permute_pixels, perm=perm, source=source)
        return _task(base, args, t, f"permutation {t}", transform)

    return _seq(name, LazyTasks(n_tasks, build), "permuted")


def normalise_images(x: Tensor, train: bool, source: str) -> Tensor:
    """uint8 [B, 28, 28] -> normalised [B, 1, 28, 28], nothing else."""
    return _normalise(_to_unit(x), source)


def single(source: str, name: str, args: BenchmarkArgs) -> TaskSequence:
    """The whole dataset as one 10-class task (e.g. to compare pruners without CL)."""
    transform = functools.partial(normalise_images, source=source)
    task = _task(_base_splits(source, args), args, 0, f"{source} (10 classes)", transform)
    return _seq(name, [task], "single")


ROTATION_ANGLES = [10.0 * (i + 1) for i in range(36)]


def rotation_order(seed: int, n_tasks: int) -> list[float]:
    """The first ``n_tasks`` of the 36 rotations 10..360 degrees, in a seeded random order."""
    order = torch.randperm(len(ROTATION_ANGLES), generator=torch.Generator().manual_seed(seed))
    return [ROTATION_ANGLES[i] for i in order[:n_tasks].tolist()]


def rotated(source: str, name: str, args: BenchmarkArgs) -> TaskSequence:
    """Task t rotates every image by the same angle; angles are visited in a seeded order."""
    n_tasks = args.n_tasks or 36
    base = _base_splits(source, args)
    angles = rotation_order(args.seed, n_tasks)
    tasks = []
    for t, angle in enumerate(angles):
        transform = functools.partial(rotate_images, angle=angle, source=source)
        tasks.append(_task(base, args, t, f"rotation {angle:g}", transform))
    return _seq(name, tasks, "rotated", angles=angles)


for _source, _label in (("mnist", "MNIST"), ("fashion-mnist", "Fashion-MNIST")):
    for _kind, _fn, _max, _what in (
        ("permuted", permuted, MAX_PERMUTED_TASKS, "a fixed random pixel permutation per task"),
        ("rotated", rotated, 36, "rotations of 10..360 degrees in a seeded random order"),
    ):
        _name = f"{_kind}-{_source}"
        BENCHMARKS.register(_name)(
            Benchmark(
                build=functools.partial(_fn, _source, _name),
                default_tasks=36,
                max_tasks=_max,
                description=f"{_label}, {_what}; 10 classes per task, shared head",
                defaults=MNIST,
            )
        )
    BENCHMARKS.register(_source)(
        Benchmark(
            build=functools.partial(single, _source, _source),
            default_tasks=1,
            max_tasks=1,
            description=f"{_label} as one 10-class task (shared head)",
            defaults=MNIST,
        )
    )
