"""Tasks from a user's own data: ``(x, y)`` tensors, any iterable of ``(x, y)`` batches, or task
files (``task-NNNN.safetensors``, benchmark ``tensors``: docs/recipes.md), gathered once into
tensors on the training device, so that they are batched like every built-in benchmark.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor
from torch.utils.data import Dataset

from espn.data.registry import BENCHMARKS, Benchmark, BenchmarkArgs
from espn.data.tasks import Split, Task, TaskSequence, subset_index
from espn.errors import EspnError
from espn.settings.recipes import MNIST
from espn.utils.io import atomic_target
from espn.utils.limits import MAX_CLASSES
from espn.utils.transforms import identity as identity


class TaskDataError(EspnError, ValueError):
    """Task data that cannot be used; the message says what was wrong and what is accepted."""


#: what a task's data may be: ``(x, y)`` tensors or an iterable of ``(x, y[, ...])`` batches
TaskData = tuple[Tensor, Tensor] | Iterable[Any]
ACCEPTED = "(x, y) tensors or an iterable of (x, y) batches (a DataLoader, a list)"
#: the most batches an iterable of task data may yield: one that yields more (an endless
#: generator, a DataLoader over a stream) is refused rather than read forever; an iterable
#: with ``len()`` is checked before it is read
MAX_BATCHES = 1_000_000
#: the most bytes of inputs one split may gather (the data are held on the training device)
MAX_BYTES = 16 * 2**30


def as_tensors(data: TaskData, what: str = "data") -> tuple[Tensor, Tensor]:
    """``(x, y)`` of ``data``: a pair of tensors as is, or the batches of an iterable
    concatenated (a batch may carry more than ``(x, y)``, e.g. Avalanche's task label: the
    rest is ignored). Labels must be integers, one per sample."""
    if (
        isinstance(data, tuple | list)
        and len(data) == 2
        and all(isinstance(t, Tensor) for t in data)
    ):
        x, y = data
    else:
        if isinstance(data, Tensor) or not isinstance(data, Iterable):
            hint = " (a Dataset: wrap it in a DataLoader)" if isinstance(data, Dataset) else ""
            raise TaskDataError(f"{what}: expected {ACCEPTED}, got {type(data).__name__}{hint}")
        xs, ys = [], []
        size = _length(data)
        if size is not None and size > MAX_BATCHES:
            raise TaskDataError(_endless(what, f"has {size} batches"))
        gathered = 0
        for i, batch in enumerate(data):
            if i == MAX_BATCHES:
                raise TaskDataError(_endless(what, "did not end"))
            if (
                not isinstance(batch, tuple | list)
                or len(batch) < 2
                or not isinstance(batch[0], Tensor)
                or not isinstance(batch[1], Tensor)
            ):
                raise TaskDataError(
                    f"{what}: batch {i} is a {type(batch).__name__}, not an (x, y) pair of "
                    f"tensors; expected {ACCEPTED} (a Dataset yields single samples: wrap it "
                    "in a DataLoader)"
                )
            gathered += batch[0].numel() * batch[0].element_size()
            if gathered > MAX_BYTES:
                raise TaskDataError(
                    f"{what}: the batches hold more than {MAX_BYTES / 2**30:g} GiB of inputs "
                    f"by batch {i}, more than espn gathers onto the device for one task; give "
                    "fewer samples (a subset, itertools.islice(batches, n))"
                )
            xs.append(batch[0])
            ys.append(batch[1].to(batch[0].device))
        if not xs:
            raise TaskDataError(f"{what} holds no batch; expected {ACCEPTED}")
        x, y = torch.cat(xs), torch.cat(ys)
    if x.dim() < 2 or y.dim() != 1 or len(x) != len(y):
        raise TaskDataError(
            f"{what}: expected x of shape [N, ...] and labels y of shape [N], got x "
            f"{list(x.shape)} and y {list(y.shape)}"
        )
    if len(x) == 0:
        raise TaskDataError(
            f"{what} holds no samples (x of shape {list(x.shape)}); give at least one"
        )
    if y.dtype.is_floating_point or y.dtype == torch.bool or y.is_complex():
        raise TaskDataError(f"{what}: labels must be integer class indices, got dtype {y.dtype}")
    if len(y) and int(y.min()) < 0:
        raise TaskDataError(f"{what}: labels must be class indices >= 0, got {int(y.min())}")
    return x, y.long()


def _length(data: Iterable[Any]) -> int | None:
    """``len(data)``, or None for an iterable without one (a generator; a DataLoader over an
    iterable dataset raises TypeError)."""
    if not isinstance(data, Sized):
        return None
    try:
        return len(data)
    except TypeError:
        return None


def _endless(what: str, how: str) -> str:
    return (
        f"{what}: the iterable {how} within {MAX_BATCHES} batches, the most espn reads for one "
        "task (is it an endless generator?); give a finite one, e.g. "
        "itertools.islice(batches, n), or (x, y) tensors"
    )


def _check_labels_from_zero(name: str, y: Tensor, n_classes: int) -> None:
    """With the head's width inferred (largest label + 1), every class below it must occur in
    the training labels: labels 3..5 would silently give a 6-way head whose classes 0..2 no
    sample teaches (and that predictions may still pick). Refused, never remapped: a remap
    would change what the predicted indices mean; ``n_classes`` given keeps such a head.
    A width beyond :data:`MAX_CLASSES` is left to the caller, which refuses it."""
    present = torch.unique(y)  # sorted; no tensor of n_classes entries is allocated
    if present.numel() == n_classes or n_classes > MAX_CLASSES:
        return
    missing: list[int] = []
    expected = 0
    for label in present.tolist():  # once per distinct label, to name the first gaps
        missing += range(expected, min(label, expected + 5 - len(missing)))
        expected = label + 1
    count = n_classes - present.numel()
    shown = ", ".join(map(str, missing[:5])) + (f" and {count - 5} more" if count > 5 else "")
    raise TaskDataError(
        f"{name}: the training labels run {int(present[0])}..{n_classes - 1} but {shown} "
        f"never occur, so the head inferred from them (largest label + 1 = {n_classes} "
        "classes) would hold classes no sample teaches; relabel from 0 (e.g. y - y.min()), "
        f"or give n_classes={n_classes} to keep that head"
    )


def tensor_task(
    name: str,
    train: TaskData | None,
    test: TaskData | None = None,
    n_classes: int | None = None,
    device: torch.device | str = "cpu",
) -> Task:
    """A :class:`Task` of the given data on ``device`` (either split may be missing: then it
    is empty). ``n_classes`` defaults to the largest label + 1; a label beyond it is refused."""
    splits: dict[str, tuple[Tensor, Tensor] | None] = {}
    for split, data in (("train", train), ("test", test)):
        if data is None:
            splits[split] = None
            continue
        x, y = as_tensors(data, f"{name}: {split} data")
        splits[split] = (x.to(device), y.to(device))
    shapes = {tuple(s[0].shape[1:]) for s in splits.values() if s is not None}
    if len(shapes) > 1:
        raise TaskDataError(f"{name}: train and test inputs differ in shape: {sorted(shapes)}")
    top = max((int(s[1].max()) for s in splits.values() if s is not None and len(s[1])), default=-1)
    if n_classes is None:
        n_classes = top + 1
        if splits["train"] is not None:
            _check_labels_from_zero(name, splits["train"][1], n_classes)
    if n_classes < 1 or top >= n_classes:
        raise TaskDataError(
            f"{name}: n_classes {n_classes} does not cover the labels (largest {top}); "
            "give n_classes > every label, or leave it out"
        )
    shape = next(iter(shapes), (0,))
    empty = (torch.zeros(0, *shape, device=device), torch.zeros(0, dtype=torch.long, device=device))

    def split_of(pair: tuple[Tensor, Tensor] | None) -> Split:
        x, y = pair or empty
        return Split(x, torch.arange(len(y), device=device), y)

    return Task(name, split_of(splits["train"]), split_of(splits["test"]), identity, n_classes)


def split_tensors(task: Task, split: str) -> tuple[Tensor, Tensor]:
    """The samples of ``task``'s ``split`` as model inputs (no augmentation) and labels."""
    data = task.split(split)
    return task.transform(data.x[data.index], False), data.y


def task_path(directory: Path | str, index: int) -> Path:
    """Where task ``index``'s file lies in a ``tensors`` data directory."""
    return Path(directory) / f"task-{index:04d}.safetensors"


def save_task(path: Path | str, task: Task, splits: tuple[str, ...] = ("train", "test")) -> Path:
    """Write ``task``'s ``splits`` (those that hold samples) as a task file, atomically."""
    path = Path(path)
    tensors = {}
    for split in splits:
        if len(task.split(split)):
            x, y = split_tensors(task, split)
            tensors[f"{split}.x"], tensors[f"{split}.y"] = x, y
    meta = {"name": task.name, "n_classes": str(task.n_classes)}
    flat = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_target(path) as tmp:
        save_file(flat, str(tmp), metadata=meta)
    return path


def load_task(path: Path | str, device: torch.device | str = "cpu") -> Task:
    """Read a task file written by :func:`save_task`."""
    path = Path(path)
    try:
        tensors = load_file(str(path))
        with safe_open(str(path), "pt") as fh:
            meta = fh.metadata() or {}
    except (OSError, SafetensorError, ValueError) as exc:
        raise TaskDataError(f"task file {path} cannot be read: {exc}") from None
    pairs = {}
    for split in ("train", "test"):
        if f"{split}.x" in tensors and f"{split}.y" in tensors:
            pairs[split] = (tensors[f"{split}.x"], tensors[f"{split}.y"])
    if not pairs:
        raise TaskDataError(f"task file {path} holds neither train.x/train.y nor test.x/test.y")
    n_classes = int(meta["n_classes"]) if "n_classes" in meta else None
    name = meta.get("name", path.stem)
    return tensor_task(name, pairs.get("train"), pairs.get("test"), n_classes, device)


def build_tensor_files(args: BenchmarkArgs) -> TaskSequence:
    """The ``tensors`` benchmark: the first ``n_tasks`` task files of ``data_dir``."""
    if args.data_dir is None:
        raise TaskDataError(
            "benchmark tensors reads its tasks from --data-dir DIR (task-0000.safetensors, ...)"
        )
    n = args.n_tasks or 1
    paths = [task_path(args.data_dir, t) for t in range(n)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise TaskDataError(
            f"benchmark tensors: {len(missing)} of {n} task files missing: {missing[0]}"
        )
    tasks = []
    for t, path in enumerate(paths):
        task = load_task(path, args.device)
        gen = torch.Generator().manual_seed(args.seed + t)
        for split, keep in (("train", args.train_per_task), ("test", args.test_per_task)):
            data = task.split(split)
            rows = subset_index(len(data), keep, gen).to(data.index.device)
            setattr(task, split, Split(data.x, data.index[rows], data.y[rows]))
        tasks.append(task)
    shapes = {tuple(t.split("test" if len(t.test) else "train").x.shape[1:]) for t in tasks}
    if len(shapes) != 1:
        raise TaskDataError(
            f"benchmark tensors: the tasks' inputs differ in shape: {sorted(shapes)}"
        )
    return TaskSequence("tensors", tasks, shapes.pop(), multi_head=True)


BENCHMARKS.register("tensors")(
    Benchmark(
        build_tensor_files,
        default_tasks=1,
        max_tasks=None,
        description="your own tasks as task-NNNN.safetensors files in --data-dir (give --tasks)",
        # data espn has never seen: the FC recipe (--recipe cifar for a conv network), as
        # the Python learner picks for an FC network
        defaults=MNIST,
    )
)
