"""Helpers of the image-benchmark and conv-pruning tests: fake raw CIFAR-shaped datasets made
on the spot (learnable noisy class prototypes), and random task sub-networks."""

from __future__ import annotations

import pytest
import torch

import espn.data.cifar as cifar_module
from espn.models import ModelSpec
from espn.models.convert_checks import random_units
from espn.models.resnet import BasicBlock, ResNet
from espn.supernet import Supernet, TaskHead


def fake_raw(
    n_classes: int,
    n_train: int,
    n_test: int,
    shape: tuple[int, ...] = (3, 32, 32),
    seed: int = 0,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``n_train`` / ``n_test`` uint8 images per class: a noisy prototype per class, labels
    interleaved (0, 1, ..., n_classes - 1, 0, 1, ...) like a shuffled real dataset."""
    gen = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(n_classes, *shape, generator=gen) * 255

    def split(per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(per_class * n_classes) % n_classes
        noise = torch.randn(len(y), *shape, generator=gen) * 50
        return (prototypes[y] + noise).clamp(0, 255).to(torch.uint8), y

    return {"train": split(n_train), "test": split(n_test)}


def patch_raw(monkeypatch: pytest.MonkeyPatch, per_source: dict[str, dict]) -> list[tuple]:
    """Make the split benchmarks read ``per_source[source]``; returns the calls made."""
    calls: list[tuple] = []

    def load_raw(source, root, download):
        calls.append((source, root, download))
        return per_source[source]

    monkeypatch.setattr(cifar_module, "load_raw", load_raw)
    return calls


@torch.no_grad()
def random_task(
    sn: Supernet, n_classes: int, x: torch.Tensor, gen: torch.Generator, keep: float
) -> dict[str, torch.Tensor]:
    """Commit a task with random BatchNorm/head state and random unit masks keeping about
    ``keep`` of every group (at least one unit); returns the unit masks."""
    sn.begin_task(n_classes)
    for m in sn.task_modules.values():
        for name, p in m.named_parameters():
            centre = 1.0 if name == "weight" and not isinstance(m, TaskHead) else 0.0
            p.copy_(centre + 0.2 * torch.randn(p.shape, generator=gen))
    sn.train()
    sn.forward_working(x)
    units = random_units(sn.group_sizes, gen, keep)
    sn.set_unit_masks(units)
    sn.eval()
    sn.commit_task()
    return units


def small_resnet(spec: ModelSpec) -> ResNet:
    """The reduced ResNet18's structure at a test-friendly size: nf=8, blocks [2, 2, 1, 1]
    (stem in the first stream, downsample shortcuts, inner groups, task BatchNorm, heads),
    its residual streams pruned as ``spec.stream_pruning`` says."""
    return ResNet(
        BasicBlock,
        [2, 2, 1, 1],
        8,
        spec.input_shape[0],
        spec.n_classes,
        True,
        streams=spec.stream_pruning,
    )
