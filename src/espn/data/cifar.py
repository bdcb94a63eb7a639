"""Class-split image benchmarks (SplitCIFAR100, SplitCIFAR10, CIFAR10, SplitFashionMNIST; see
docs/benchmarks.md): images held once on the device, each task its classes' indices."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import Tensor

from espn.data.augment import ImageTransform
from espn.data.mnist import NORMALISATION
from espn.data.registry import BENCHMARKS, Benchmark, BenchmarkArgs, task_generator
from espn.data.sources import default_data_dir, load_mnist_like, torchvision_splits
from espn.data.tasks import Split, Task, TaskSequence, subset_index
from espn.settings.recipes import CIFAR, FASHION

#: per-channel mean and std of the training images
STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "fashion-mnist": ((NORMALISATION["fashion-mnist"][0],), (NORMALISATION["fashion-mnist"][1],)),
}
SHAPES = {"cifar10": (3, 32, 32), "cifar100": (3, 32, 32), "fashion-mnist": (1, 28, 28)}
HOW_TO_GET = "run once with internet access (torchvision downloads it into the data directory)"

Raw = dict[str, tuple[Tensor, Tensor]]


def load_cifar(name: str, root: Path | None = None, download: bool = True) -> Raw:
    """``{"train": (uint8 [N, 3, 32, 32], labels), "test": ...}`` of CIFAR-10 or CIFAR-100
    through torchvision (which downloads it into ``root`` when ``download`` is set)."""
    root = Path(root) if root is not None else default_data_dir()
    folder = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}[name]
    how = f"{HOW_TO_GET}, or pass --data-dir pointing at a directory holding {folder}/"
    splits = torchvision_splits(name, name.upper(), root, download, how)
    return {
        s: (torch.from_numpy(d.data).permute(0, 3, 1, 2).contiguous(), torch.as_tensor(d.targets))
        for s, d in splits.items()
    }


def load_raw(source: str, root: Path | None, download: bool) -> Raw:
    """The raw uint8 images and labels of ``source`` (tests replace this function)."""
    if source == "fashion-mnist":
        return load_mnist_like(source, root, download)
    return load_cifar(source, root, download)


#: the CIFAR-100 superclass (coarse label) of every class (fine label), as the dataset ships it
CIFAR100_SUPERCLASS = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)  # fmt: skip


def class_order(n_classes: int, seed: int, order: str = "random") -> list[int]:
    """The order in which classes are dealt to the tasks: ``random`` (drawn from the seed) or
    ``superclass`` (CIFAR-100: superclass 0's five classes, then superclass 1's, ...; the
    authors' fixed split)."""
    if order == "superclass":
        if n_classes != len(CIFAR100_SUPERCLASS):
            raise ValueError("the superclass order exists for CIFAR-100 only")
        return sorted(range(n_classes), key=lambda c: (CIFAR100_SUPERCLASS[c], c))
    return torch.randperm(n_classes, generator=torch.Generator().manual_seed(seed)).tolist()


def _task_split(
    x: Tensor, y: Tensor, classes: Tensor, keep: int | None, gen: torch.Generator
) -> Split:
    """The samples of ``classes`` (a seeded subset of ``keep`` of them), relabelled 0..k-1."""
    mine = torch.isin(y, classes).nonzero().flatten()
    mine = mine[subset_index(len(mine), keep, gen).to(mine.device)]
    remap = torch.full((int(y.max()) + 1,), -1, dtype=torch.long, device=y.device)
    remap[classes] = torch.arange(len(classes), device=y.device)
    return Split(x, mine, remap[y[mine]])


def split_benchmark(
    source: str,
    name: str,
    classes_per_task: int,
    augment: bool,
    args: BenchmarkArgs,
    shuffle_classes: bool = True,
) -> TaskSequence:
    """Tasks of ``classes_per_task`` classes each, the class order drawn from ``args.seed``."""
    raw = load_raw(source, args.data_dir, args.download)
    device = torch.device(args.device)
    data = {s: (x.to(device), y.to(device)) for s, (x, y) in raw.items()}
    n_total = int(raw["train"][1].max()) + 1
    max_tasks = n_total // classes_per_task
    n_tasks = args.n_tasks or max_tasks
    if n_tasks > max_tasks:
        raise ValueError(f"{name} has at most {max_tasks} tasks, got {n_tasks}")
    order = (
        class_order(n_total, args.seed, args.class_order or "random")
        if shuffle_classes
        else list(range(n_total))
    )
    mean, std = STATS[source]
    transform = ImageTransform(mean, std, crop_padding=4 if augment else 0, flip=augment)
    tasks = []
    for t in range(n_tasks):
        classes = order[t * classes_per_task : (t + 1) * classes_per_task]
        cls_t = torch.tensor(classes, device=device)
        splits = [
            _task_split(*data[split], cls_t, keep, task_generator(args.seed, t, salt))
            for salt, (split, keep) in enumerate(
                (("train", args.train_keep(t)), ("test", args.test_per_task))
            )
        ]
        label = ",".join(map(str, classes))
        tasks.append(Task(f"classes {label}", splits[0], splits[1], transform, len(classes)))
    return TaskSequence(
        name,
        tasks,
        SHAPES[source],
        multi_head=True,
        info={
            "kind": "split",
            "source": source,
            "class_order": order[: n_tasks * classes_per_task],
        },
    )


for _name, _source, _k, _what in (
    ("split-cifar100", "cifar100", 5, "CIFAR-100 in tasks of 5 classes"),
    ("split-cifar10", "cifar10", 2, "CIFAR-10 in tasks of 2 classes"),
    ("cifar10", "cifar10", 10, "CIFAR-10 as one 10-class task"),
    ("split-fashion-mnist", "fashion-mnist", 2, "Fashion-MNIST in tasks of 2 classes"),
):
    _n = (100 if _source == "cifar100" else 10) // _k
    _shuffle, _augment = _n > 1, _source != "fashion-mnist"  # one task: no class order
    _orders = ("random", "superclass") if _source == "cifar100" else ("random",)
    BENCHMARKS.register(_name)(
        Benchmark(
            build=functools.partial(
                split_benchmark, _source, _name, _k, _augment, shuffle_classes=_shuffle
            ),
            default_tasks=_n,
            max_tasks=_n,
            description=f"{_what} ({'seeded class order, ' if _shuffle else ''}"
            f"one head per task{', crop+flip augmentation' if _augment else ''})",
            defaults=CIFAR if _augment else FASHION,
            class_orders=_orders if _shuffle else (),
        )
    )
