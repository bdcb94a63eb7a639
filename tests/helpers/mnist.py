"""Synthetic MNIST-shaped data: learnable in a few steps, made on the spot."""

from __future__ import annotations

import torch


def synthetic_mnist(n_train: int = 400, n_test: int = 200, seed: int = 0) -> dict:
    """Ten noisy class prototypes as uint8 28x28 images: learnable in a few steps."""
    gen = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(10, 28, 28, generator=gen) * 255

    def split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(n) % 10
        noise = torch.randn(n, 28, 28, generator=gen) * 60
        x = (prototypes[y] + noise).clamp(0, 255).to(torch.uint8)
        return x, y

    return {"train": split(n_train), "test": split(n_test)}
