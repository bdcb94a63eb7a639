"""The `espn` command line: a full tiny run, and every bad input rejected clearly."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from espn.cli.main import app

runner = CliRunner()
TINY = ["--tasks", "3", "--epochs", "1,1,1", "--batch-size", "128", "--no-progress"]


@pytest.mark.parametrize("method", ["espn", "packnet"])
def test_run_writes_results_and_plot(fake_mnist, tmp_path, method):
    out = tmp_path / method
    args = ["run", "--benchmark", "rotated-mnist", "--method", method, "--out", str(out), *TINY]
    # four steps per phase: the MNIST recipe's fine-tuning at 1e-4 could not recover from pruning
    result = runner.invoke(app, [*args, "--finetune-lr", "1e-3", "--finetune-schedule", "cosine"])
    assert result.exit_code == 0, result.output
    assert "average accuracy" in result.output
    doc = json.loads((out / "results.json").read_text())
    for key in (
        "method",
        "benchmark",
        "seed",
        "gamma",
        "alpha",
        "accuracy_matrix",
        "final_accuracy",
        "average_accuracy",
        "flops_ratio",
        "new_weights",
        "weight_budget",
    ):
        assert key in doc
    matrix = doc["accuracy_matrix"]
    assert [len(row) for row in matrix] == [1, 2, 3]
    # exactly zero forgetting
    assert all(doc["final_accuracy"][j] == matrix[j][j] for j in range(3))
    assert doc["average_accuracy"] == pytest.approx(sum(matrix[-1]) / 3)
    assert doc["gamma"] == (0.2 if method == "espn" else 1.0)
    assert doc["alpha"] == 0.05
    assert all(r <= doc["gamma"] + 1e-12 for r in doc["flops_ratio"])
    assert all(n <= b for n, b in zip(doc["new_weights"], doc["weight_budget"], strict=True))
    assert doc["complete"] is True
    assert (out / "accuracy.png").stat().st_size > 1000
    assert not list(out.glob(".*.tmp"))
    # the tiny data is learnable: better than chance on every task
    assert min(matrix[-1]) > 30

    shown = runner.invoke(app, ["show", str(out)])
    assert shown.exit_code == 0 and "average accuracy" in shown.output
    # tasks numbered from 0 everywhere: the run's per-task lines, show (as info, export --task)
    assert "task 0 (1/3 done)" in result.output and "task 2 (3/3 done)" in result.output
    rows = [line.split("│")[1].strip() for line in shown.output.splitlines() if "│" in line]
    assert rows == ["0", "1", "2"] * 2  # the per-task table, then the accuracy matrix's rows


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--benchmark", "nope"], "unknown benchmark 'nope'; choose one of: permuted-mnist"),
        (["--method", "ewc"], "unknown method 'ewc'; choose one of: cpg, espn"),
        (["--gamma", "1.5"], "gamma must be in (0, 1], got 1.5"),
        (["--gamma", "0"], "gamma must be in (0, 1], got 0.0"),
        (["--alpha", "0"], "alpha must be in (0, 1], got 0.0"),
        (["--alpha", "2"], "alpha must be in (0, 1], got 2.0"),
        (["--tasks", "0"], "tasks must be >= 1, got 0"),
        (["--benchmark", "rotated-mnist", "--tasks", "37"], "tasks must be <= 36"),
        (["--device", "tpu"], "unknown device 'tpu'; choose 'cpu', 'cuda' or 'cuda:N'"),
        (["--epochs", "3,4"], "--epochs must be three comma-separated integers"),
        (["--epochs", "0,0,0"], "epochs must be three non-negative counts"),
        (["--method", "packnet", "--gamma", "0.5"], "has no FLOP constraint"),
        # ESPN's own options: checked by their declarations
        (["--pruner", "magic"], "pruner must be one of: flop-aware, l1, polarization, got 'magic'"),
        (["--reuse", "some"], "reuse must be one of: all, magnitude, got 'some'"),
        (
            ["--optimizer", "lion"],
            "optimizer must be one of: sgd, nesterov, adam, rmsprop, got 'lion'",
        ),
        (["--train-per-task", "0"], "train_per_task must be >= 1, got 0"),
        (["--lr", "-1"], "lr must be > 0, got -1.0"),
    ],
)
def test_bad_input_is_rejected_with_a_clear_message(tmp_path, args, message):
    base = {"--benchmark": "permuted-mnist", "--out": str(tmp_path / "r")}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["run"] + [x for kv in base.items() for x in kv]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "r" / "results.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda(tmp_path):
    result = runner.invoke(
        app, ["run", "--benchmark", "permuted-mnist", "--device", "cuda", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "CUDA is not available here; use --device cpu" in " ".join(result.output.split())


def test_list_names_every_registry():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0
    for name in ("permuted-fashion-mnist", "fc1024", "espn", "packnet", "flop-aware"):
        assert name in result.output


def test_list_shows_a_model_without_docstring():
    """A model registered by import reference may have no docstring; `list` still lists it."""
    from espn.models.registry import MODELS

    def undocumented(spec):
        return None

    with MODELS.temporarily("undocumented-model", undocumented):
        result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    assert "undocumented-model" in result.output
