"""Fashion-MNIST as tensors for your own code, from the files already on disk."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from espn.data.sources import load_mnist_like


def fashion_mnist(
    root: Path | str | None = None, train: bool = True, download: bool = False
) -> tuple[Tensor, Tensor]:
    """Fashion-MNIST's training (``train``) or test split as ``(images, labels)``: float32
    ``[N, 1, 28, 28]`` in [0, 1] and int64 labels; where it is looked for: docs/python.md."""
    splits = load_mnist_like("fashion-mnist", None if root is None else Path(root), download)
    x, y = splits["train" if train else "test"]
    return x.unsqueeze(1).float().div_(255.0), y
