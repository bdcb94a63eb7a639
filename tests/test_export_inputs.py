"""An exported task takes raw inputs as the user's loader gives them (issue 37, item 15): the
benchmark's input transform (scaling, normalisation, the task's rotation or permutation) is
in the program, and its sidecar records it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from espn.cli.main import app
from helpers.mnist import synthetic_mnist

runner = CliRunner()


def write_idx(path: Path, data: torch.Tensor) -> None:
    """An uncompressed IDX file (the MNIST format) of a uint8 tensor."""
    header = bytes([0, 0, 8, data.dim()]) + b"".join(n.to_bytes(4, "big") for n in data.shape)
    path.write_bytes(header + data.to(torch.uint8).numpy().tobytes())


def read_idx(path: Path) -> np.ndarray:
    """The user's own loader: the IDX file as it is, uint8."""
    raw = path.read_bytes()
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3])]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


@pytest.fixture(scope="module")
def fashion_dir(tmp_path_factory) -> Path:
    """Small Fashion-MNIST in its real format (torchvision's layout of IDX files)."""
    root = tmp_path_factory.mktemp("data")
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    data = synthetic_mnist(n_train=512, n_test=200, seed=3)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x, y = data[split]
        write_idx(raw / f"{prefix}-images-idx3-ubyte", x)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", y)
    return root


@pytest.mark.parametrize("bench", ["rotated-fashion-mnist", "permuted-fashion-mnist"])
def test_an_exported_task_scores_its_accuracy_on_raw_test_images(
    fashion_dir, fc_test_model, tmp_path, bench
) -> None:
    run = tmp_path / "run"
    argv = ["run", "--benchmark", bench, "--data-dir", str(fashion_dir), "--tasks", "2"]
    argv += ["--model", fc_test_model, "--epochs", "2,2,2", "--batch-size", "64", "--lr", "0.01"]
    argv += ["--optimizer", "adam", "--finetune-lr", "0.001", "--gamma", "0.5", "--alpha", "0.2"]
    argv += ["--out", str(run), "--no-progress"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    target = tmp_path / "task1.pt2"
    result = runner.invoke(
        app, ["export", "--run", str(run), "--task", "1", "--out", str(target), "--no-onnx"]
    )
    assert result.exit_code == 0, result.output
    assert "takes raw inputs: uint8 [N, 28, 28]" in result.output

    images = read_idx(fashion_dir / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte")
    labels = read_idx(fashion_dir / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte")
    program = torch.export.load(str(target)).module()
    with torch.no_grad():
        predicted = program(torch.from_numpy(images.copy())).argmax(1)
    accuracy = 100.0 * float(
        (predicted == torch.from_numpy(labels.astype(np.int64))).float().mean()
    )
    doc = json.loads((run / "results.json").read_text())
    assert doc["accuracy_matrix"][-1][1] > 30  # the task learned something to compare
    assert accuracy == pytest.approx(doc["accuracy_matrix"][-1][1], abs=100.0 / len(labels))

    inputs = json.loads(target.with_suffix(".json").read_text())["inputs"]
    assert inputs["raw"] and inputs["dtype"] == "uint8" and inputs["shape"] == [28, 28]
    assert inputs["model_input_shape"] == [1, 28, 28]
    transform = inputs["transform"]
    assert transform["arguments"]["source"] == "fashion-mnist"
    if bench.startswith("rotated"):
        assert transform["function"].endswith("rotate_images")
        assert f"rotation {transform['arguments']['angle']:g}" == doc["task_names"][1]
    else:
        assert transform["function"].endswith("permute_pixels")
        assert sorted(transform["arguments"]["perm"]) == list(range(784))


def test_a_relative_data_dir_is_read_from_where_espn_ran(
    fashion_dir, fc_test_model, tmp_path, monkeypatch
) -> None:
    """``--data-dir`` relative to the working directory is stored absolute: a run read back
    (here by ``--task-agnostic``'s closing evaluation) finds the data, not RUN/<relative>."""
    monkeypatch.chdir(fashion_dir.parent)
    run = tmp_path / "run"
    argv = ["run", "--benchmark", "permuted-fashion-mnist", "--data-dir", fashion_dir.name]
    argv += ["--tasks", "2", "--model", fc_test_model, "--epochs", "1,1,1", "--out", str(run)]
    result = runner.invoke(app, [*argv, "--no-progress", "--task-agnostic"])
    assert result.exit_code == 0, result.output
    doc = json.loads((run / "results.json").read_text())
    assert Path(doc["config"]["data_dir"]) == fashion_dir.resolve()
    assert "task_agnostic" in doc
