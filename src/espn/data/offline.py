"""Fashion-MNIST as tensors for your own code, from the files already on disk."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from espn.data.sources import load_mnist_like


def fashion_mnist(
    root: Path | str | None = None, train: bool = True, download: bool = False
) -> tuple[Tensor, Tensor]:
    """Fashion-MNIST's training (``train``) or test split as ``(images, labels)``: images
    float32 ``[N, 1, 28, 28]`` in [0, 1], labels int64 ``[N]`` in 0..9 (60000 / 10000).

    Looked for in ``root`` (a directory holding ``train-images-idx3-ubyte.gz`` and the
    other three IDX files, gzipped or not, or torchvision's ``root/FashionMNIST/raw``;
    default ``$ESPN_DATA`` or ``~/.cache/espn/data``), then in Debian's
    ``/usr/share/datasets/fashion-mnist``; downloaded by torchvision only with ``download``.
    Missing data raise :class:`espn.data.DatasetUnavailable` saying how to get it.
    """
    splits = load_mnist_like("fashion-mnist", None if root is None else Path(root), download)
    x, y = splits["train" if train else "test"]
    return x.unsqueeze(1).float().div_(255.0), y
