"""``image-folders``: one task per ImageFolder directory (``--folders``), decoded once onto the
device or batch by batch when it does not fit (docs/benchmarks.md)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from espn.data.augment import ImageTransform
from espn.data.registry import BENCHMARKS, Benchmark, BenchmarkArgs, task_generator
from espn.data.sources import DatasetUnavailable
from espn.data.tasks import Split, Task, TaskSequence, subset_index
from espn.settings.recipes import FOLDERS

IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
DEFAULT_IMAGE_SIZE = 224
TEST_FRACTION = 0.2
Samples = list[tuple[str, int]]


def workers() -> int:
    """Decoding workers: ``$ESPN_WORKERS``, else up to 8 of the CPU cores."""
    return int(os.environ.get("ESPN_WORKERS", min(8, os.cpu_count() or 1)))


def decode(path: str, size: int) -> Tensor:
    """uint8 ``[3, size, size]``: RGB, shorter side resized to ``size``, centre-cropped."""
    import torchvision.transforms.v2.functional as TF  # importing torchvision costs seconds
    from PIL import Image

    try:
        with Image.open(path) as pil:
            pil.draft("RGB", (size, size))  # JPEG: decode at a reduced scale when possible
            img = TF.pil_to_tensor(pil.convert("RGB"))
    except OSError as exc:
        raise DatasetUnavailable(f"cannot decode image {path}: {exc}") from exc
    img = TF.resize(img, [size], antialias=True)
    return TF.center_crop(img, [size, size])


class DecodedImages(Dataset):
    """Images of a list of files, decoded and resized on access: ``x[i]`` one image (in
    DataLoader workers), ``x[index]`` those of a tensor of indices onto ``device`` (the image
    tensor of a streamed split; training and evaluation decode in :meth:`StreamingTask.inputs`)."""

    def __init__(self, paths: list[str], size: int, device: torch.device | None = None) -> None:
        self.paths = paths
        self.size = size
        self.device = device or torch.device("cpu")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int | Tensor) -> Tensor:
        if isinstance(i, Tensor):
            return torch.stack([self[j] for j in i.flatten().tolist()]).to(self.device)
        return decode(self.paths[i], self.size)


@dataclass
class StreamingTask(Task):
    """A task whose images are decoded batch by batch by DataLoader workers."""

    n_workers: int = 0

    def inputs(self, split: str, rows: list[Tensor], train: bool) -> Iterator[Tensor]:
        data = self.split(split)
        images: DecodedImages = data.x  # type: ignore[assignment]
        loader = DataLoader(
            images,
            batch_sampler=[data.index[r].tolist() for r in rows],
            num_workers=self.n_workers,
            pin_memory=images.device.type == "cuda",
            # its own generator: the loader leaves torch's default one (augmentation) alone
            generator=torch.Generator().manual_seed(0),
        )
        for x in loader:
            yield self.transform(x.to(images.device, non_blocking=True), train)


def folder_samples(root: Path, seed: int, salt: int) -> tuple[list[str], Samples, Samples]:
    """Class names and the (path, label) train and test samples of one task directory."""
    from torchvision.datasets import ImageFolder

    if not root.is_dir():
        raise DatasetUnavailable(f"image folder {root} does not exist or is not a directory")
    test_dir = next((root / s for s in ("val", "test") if (root / s).is_dir()), None)

    def scan(path: Path) -> ImageFolder:
        try:
            return ImageFolder(str(path), loader=lambda p: p)
        except (FileNotFoundError, RuntimeError) as exc:
            raise DatasetUnavailable(
                f"{path} is not an ImageFolder directory (<class>/<image> files): {exc}"
            ) from exc

    if (root / "train").is_dir() and test_dir is not None:
        train, test = scan(root / "train"), scan(test_dir)
        if train.classes != test.classes:
            raise DatasetUnavailable(
                f"{root}: the classes of train/ and {test_dir.name}/ differ "
                f"({len(train.classes)} vs {len(test.classes)} class directories)"
            )
        return train.classes, list(train.samples), list(test.samples)
    whole = scan(root)
    gen = task_generator(seed, 0, 1000 + salt)
    labels = torch.tensor(whole.targets)
    is_test = torch.zeros(len(labels), dtype=torch.bool)
    for c in range(len(whole.classes)):
        mine = (labels == c).nonzero().flatten()
        n_test = round(TEST_FRACTION * len(mine))
        is_test[mine[torch.randperm(len(mine), generator=gen)[:n_test]]] = True
    samples = whole.samples
    return (
        whole.classes,
        [s for s, t in zip(samples, is_test.tolist(), strict=True) if not t],
        [s for s, t in zip(samples, is_test.tolist(), strict=True) if t],
    )


def _decode_all(paths: list[str], size: int, device: torch.device) -> Tensor:
    n_workers = workers() if len(paths) >= 1024 else 0  # starting workers costs seconds
    loader = DataLoader(DecodedImages(paths, size), batch_size=256, num_workers=n_workers)
    return torch.cat([x.to(device) for x in loader])


def _fits(n_images: int, size: int, device: torch.device) -> bool:
    mode = os.environ.get("ESPN_FOLDERS_MODE", "auto")
    if mode not in ("auto", "memory", "stream"):
        raise ValueError(f"ESPN_FOLDERS_MODE={mode!r}; choose auto, memory or stream")
    if mode != "auto":
        return mode == "memory"
    need = n_images * 3 * size * size
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return need <= free // 2


def _kept_samples(args: BenchmarkArgs, t: int, root: Path) -> tuple[list[str], list[Samples]]:
    """Task ``t``'s classes and the (path, label) samples its train and test splits keep."""
    classes, train, test = folder_samples(root, args.seed, t)
    if len(classes) < 2:
        raise DatasetUnavailable(
            f"{root}: a task needs at least 2 classes (class directories), found "
            f"{len(classes)}: {', '.join(classes) or 'none'}"
        )
    keep = []
    for salt, (samples, n) in enumerate(((train, args.train_keep(t)), (test, args.test_per_task))):
        if not samples:
            raise DatasetUnavailable(f"{root}: no images for the {('train', 'test')[salt]} split")
        idx = subset_index(len(samples), n, task_generator(args.seed, t, salt)).tolist()
        keep.append([samples[i] for i in idx])
    return classes, keep


def _split(samples: Samples, size: int, device: torch.device, memory: bool) -> Split:
    """A split of ``samples``: decoded onto ``device`` now (``memory``) or batch by batch."""
    paths = [p for p, _ in samples]
    y = torch.tensor([label for _, label in samples], device=device)
    index = torch.arange(len(samples), device=device)
    if memory:
        x: Tensor | DecodedImages = _decode_all(paths, size, device)
    else:
        x = DecodedImages(paths, size, device)
    return Split(x, index, y)  # type: ignore[arg-type]


def image_folders(
    args: BenchmarkArgs, in_memory: bool | None = None, n_workers: int | None = None
) -> TaskSequence:
    """One task per directory of ``args.folders`` (docs/benchmarks.md), held on the device
    (``in_memory`` True) or streamed (False); None decides by size."""
    if not args.folders:
        raise DatasetUnavailable(
            "image-folders needs its directories: --folders DIR1,DIR2,... (one per task)"
        )
    folders = [Path(f) for f in args.folders][: args.n_tasks or None]
    size = args.image_size or DEFAULT_IMAGE_SIZE
    device = torch.device(args.device)
    listed = [(root, *_kept_samples(args, t, root)) for t, root in enumerate(folders)]
    total = sum(len(s) for _, _, keep in listed for s in keep)
    memory = _fits(total, size, device) if in_memory is None else in_memory
    transform = ImageTransform(*IMAGENET_STATS, crop_padding=size // 8, flip=True)
    n_workers = workers() if n_workers is None else n_workers
    tasks: list[Task] = []
    for root, classes, keep in listed:
        train, test = (_split(samples, size, device, memory) for samples in keep)
        fields = (root.name or str(root), train, test, transform, len(classes))
        tasks.append(Task(*fields) if memory else StreamingTask(*fields, n_workers))
    return TaskSequence(
        "image-folders",
        tasks,
        (3, size, size),
        multi_head=True,
        info={"kind": "folders", "folders": [str(f) for f in folders], "in_memory": memory},
    )


BENCHMARKS.register("image-folders")(
    Benchmark(
        build=image_folders,
        default_tasks=6,
        max_tasks=None,
        description="one task per ImageFolder directory given with --folders "
        "(e.g. ImageNet, CUBS, Cars, Flowers, WikiArt, Sketch), one head per task",
        defaults=FOLDERS,
        needs_folders=True,
    )
)
