"""Shared fixtures: small learnable MNIST-shaped data made on the spot, tiny configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import espn.data.mnist as mnist_module
from deploy_fixtures import cli_options, register_fc_test
from espn.cli.main import app


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
def cli_run(fake_mnist: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A finished 3-task run of the tiny FC model made through ``espn run``: its out dir."""
    register_fc_test(monkeypatch)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, cli_options(out))
    assert result.exit_code == 0, result.output
    return out
