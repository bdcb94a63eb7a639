"""Shared fixtures: small learnable MNIST-shaped data made on the spot, tiny configs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import espn.data.mnist as mnist_module
from baseline_fixtures import fc_small
from deploy_fixtures import cli_options, fc_test
from espn.cli.main import app
from espn.models.registry import MODELS
from image_fixtures import small_resnet


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


@pytest.fixture
def fake_mnist(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Replace the raw (Fashion-)MNIST loader of the benchmarks with synthetic images."""
    data = synthetic_mnist()
    monkeypatch.setattr(mnist_module, "load_mnist_like", lambda *a, **k: data)
    return data


@pytest.fixture
def tiny_run_args(tmp_path) -> dict:
    """Keyword arguments of a seconds-long run on the fake data."""
    return {
        "benchmark": "permuted-mnist",
        "tasks": 3,
        "epochs": (1, 1, 1),
        "batch_size": 128,
        "out": tmp_path / "run",
    }


@pytest.fixture
def fc_test_model() -> Iterator[str]:
    """Model ``fc-test`` (784-64-48-classes, see deploy_fixtures) for the duration of a test."""
    with MODELS.temporarily("fc-test", fc_test):
        yield "fc-test"


@pytest.fixture
def fc_small_model() -> Iterator[str]:
    """Model ``fc-small`` (see baseline_fixtures) for the duration of a test."""
    with MODELS.temporarily("fc-small", fc_small):
        yield "fc-small"


@pytest.fixture
def small_resnet_model() -> Iterator[str]:
    """Model ``small-resnet`` (see image_fixtures) for the duration of a test."""
    with MODELS.temporarily("small-resnet", small_resnet):
        yield "small-resnet"


@pytest.fixture
def cli_run(fake_mnist: dict, fc_test_model: str, tmp_path: Path) -> Path:
    """A finished 3-task run of the tiny FC model made through ``espn run``: its out dir."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, cli_options(out))
    assert result.exit_code == 0, result.output
    return out
