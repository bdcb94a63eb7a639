"""Shared fixtures: small learnable MNIST- and CIFAR-shaped data made on the spot, tiny
configs, a finished tiny run (the helpers they use: the ``helpers`` package)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import espn.data.mnist as mnist_module
from espn.cli.main import app
from espn.models.registry import MODELS
from helpers.baseline import fc_small
from helpers.deploy import cli_options, fc_test
from helpers.images import fake_raw, patch_raw, small_resnet
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
def fc_test_model() -> Iterator[str]:
    """Model ``fc-test`` (784-64-48-classes, see helpers.deploy) for the duration of a test."""
    with MODELS.temporarily("fc-test", fc_test):
        yield "fc-test"


@pytest.fixture
def fc_small_model() -> Iterator[str]:
    """Model ``fc-small`` (see helpers.baseline) for the duration of a test."""
    with MODELS.temporarily("fc-small", fc_small):
        yield "fc-small"


@pytest.fixture
def small_resnet_model() -> Iterator[str]:
    """Model ``small-resnet`` (see helpers.images) for the duration of a test."""
    with MODELS.temporarily("small-resnet", small_resnet):
        yield "small-resnet"


@pytest.fixture
def cli_run(fake_mnist: dict, fc_test_model: str, tmp_path: Path) -> Path:
    """A finished 3-task run of the tiny FC model made through ``espn run``: its out dir."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, cli_options(out))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def fake_cifar10(monkeypatch: pytest.MonkeyPatch, small_resnet_model: str) -> dict:
    """CIFAR-10-shaped fake data (32 training and 16 test images per class), and the
    ``small-resnet`` model."""
    data = fake_raw(10, 32, 16)
    patch_raw(monkeypatch, {"cifar10": data})
    return data


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished 3-task run of ``fc-test`` on synthetic MNIST, copied by each test."""
    out = tmp_path_factory.mktemp("finished") / "run"
    data = synthetic_mnist()
    with pytest.MonkeyPatch.context() as mp, MODELS.temporarily("fc-test", fc_test):
        mp.setattr(mnist_module, "load_mnist_like", lambda *a, **k: data)
        result = CliRunner().invoke(app, cli_options(out))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def run_copy(finished_run: Path, tmp_path: Path, fake_mnist: dict, fc_test_model: str) -> Path:
    """A copy of the finished run, its data and model available as when it was made."""
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy
