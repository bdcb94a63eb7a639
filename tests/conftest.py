"""Shared fixtures: small learnable MNIST- and CIFAR-shaped data made on the spot, tiny
configs, a finished tiny run (the helpers they use: the ``helpers`` package)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import espn.data.mnist as mnist_module
from espn.cli.main import app
from helpers.deploy import cli_options, register_fc_test
from helpers.images import fake_raw, patch_raw, register_small_resnet
from helpers.mnist import synthetic_mnist


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


@pytest.fixture
def fake_cifar10(monkeypatch: pytest.MonkeyPatch) -> dict:
    """CIFAR-10-shaped fake data (32 training and 16 test images per class), and the
    ``small-resnet`` model."""
    data = fake_raw(10, 32, 16)
    patch_raw(monkeypatch, {"cifar10": data})
    register_small_resnet(monkeypatch)
    return data
