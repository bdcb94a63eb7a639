"""Image batch transforms on the data's device, vectorised over the batch: uint8 crop and flip,
then per-channel normalisation (docs/benchmarks.md). Draws come from ``generator``, else the
device's default generator, which checkpoints save (a resumed run draws the same crops)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def random_crop(x: Tensor, padding: int, generator: torch.Generator | None = None) -> Tensor:
    """Zero-pad every image by ``padding`` pixels and cut a random crop of the original size,
    with one offset per image (the standard CIFAR crop), by one gather for the whole batch
    (its index is one int64 per output pixel, shared by the channels)."""
    if padding <= 0:
        return x
    n, c, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    span = 2 * padding + 1
    dy = torch.randint(span, (n, 1), generator=generator, device=x.device)
    dx = torch.randint(span, (n, 1), generator=generator, device=x.device)
    rows = dy + torch.arange(h, device=x.device)
    cols = dx + torch.arange(w, device=x.device)
    flat = (rows[:, :, None] * (w + 2 * padding) + cols[:, None, :]).view(n, 1, h * w)
    return padded.flatten(2).gather(2, flat.expand(n, c, h * w)).view(n, c, h, w)


def random_flip(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Mirror each image left-right with probability 1/2."""
    flip = torch.rand(x.shape[0], generator=generator, device=x.device) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)


def normalise(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """uint8 images -> float32 in [0, 1] -> ``(x - mean) / std`` per channel."""
    return (x.float().div_(255.0) - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


@dataclass
class ImageTransform:
    """An image benchmark's ``Task.transform``: training batches cropped (``crop_padding`` >
    0) and flipped (``flip``), every batch normalised per channel; ``[B, H, W]`` gets its
    channel axis."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_padding: int = 0
    flip: bool = False

    def __post_init__(self) -> None:
        self._stats: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def _on(self, device: torch.device) -> tuple[Tensor, Tensor]:
        if device not in self._stats:
            self._stats[device] = (
                torch.tensor(self.mean, device=device),
                torch.tensor(self.std, device=device),
            )
        return self._stats[device]

    def __call__(self, x: Tensor, train: bool) -> Tensor:
        if x.dim() == 3:
            x = x.unsqueeze(1)
        if train:
            x = random_crop(x, self.crop_padding)
            if self.flip:
                x = random_flip(x)
        mean, std = self._on(x.device)
        return normalise(x, mean, std)
