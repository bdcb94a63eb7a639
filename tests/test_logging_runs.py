"""The loggers in real runs, through both doors: ``espn run --log tensorboard,csv`` and
``ContinualLearner(..., loggers=[...])``. Their TensorBoard events and CSV hold the per-task
accuracies, FLOPs ratios and weights that ``results.json`` holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import espn
from espn.cli.main import app
from espn.utils.io import read_csv
from helpers.deploy import cli_options
from helpers.logs import tensorboard_scalars

pytest.importorskip("tensorboard")


def assert_logs_hold(out: Path, doc: dict[str, Any], log_every: int) -> None:
    """The CSV and TensorBoard logs of the run in ``out`` agree with its ``results.json``,
    and hold every task's loss every ``log_every`` steps."""
    matrix, n = doc["accuracy_matrix"], len(doc["accuracy_matrix"])
    assert n >= 2 and all(row is not None for row in matrix)
    tasks = read_csv(out / "logs" / "csv" / "tasks.csv")
    assert [int(r["task"]) for r in tasks] == list(range(n))
    for t, row in enumerate(tasks):
        assert [float(row[f"accuracy_{j}"]) for j in range(t + 1)] == matrix[t]  # exact
        assert float(row["flops_ratio"]) == doc["flops_ratio"][t]
        assert int(row["new_weights"]) == doc["new_weights"][t]
    epochs = read_csv(out / "logs" / "csv" / "epochs.csv")
    assert sorted({int(r["task"]) for r in epochs}) == list(range(n))
    scalars = tensorboard_scalars(out / "logs" / "tensorboard")
    for j in range(n):  # float32 in the event file
        expected = [(t, pytest.approx(matrix[t][j], rel=1e-6)) for t in range(j, n)]
        assert scalars[f"accuracy/task_{j}"] == expected
    assert scalars["flops_ratio"] == [
        (t, pytest.approx(r, rel=1e-6)) for t, r in enumerate(doc["flops_ratio"])
    ]
    assert [v for _, v in scalars["weights/new"]] == doc["new_weights"]
    steps = read_csv(out / "logs" / "csv" / "steps.csv")
    for t in range(n):
        assert scalars[f"epoch_loss/task_{t}"], f"no epoch losses of task {t}"
        logged = [int(r["step"]) for r in steps if int(r["task"]) == t]
        assert logged and all(s % log_every == 0 for s in logged)
        assert logged == list(range(log_every, logged[-1] + 1, log_every))
        assert [s for s, _ in scalars[f"loss/task_{t}"]] == logged


def test_espn_run_log_tensorboard_csv(fake_mnist, fc_test_model, tmp_path):
    out = tmp_path / "run"
    args = [*cli_options(out), "--log", "tensorboard,csv", "--log-every", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert_logs_hold(out, json.loads((out / "results.json").read_text()), log_every=3)


def test_espn_run_refuses_an_unknown_logger_before_work(fake_mnist, fc_test_model, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*cli_options(out), "--log", "csv,tensorbord"])
    assert result.exit_code == 2
    assert "unknown logger 'tensorbord'; choose one of: csv, tensorboard, wandb" in result.output
    assert not (out / "results.json").exists() and not (out / "logs").exists()


def task_data(seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """One small task: noisy copies of 3 random 8x8 prototypes (96 train, 48 test)."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(3, 1, 8, 8, generator=g)
    y = torch.arange(144) % 3
    x = prototypes[y] + 0.8 * torch.randn(144, 1, 8, 8, generator=g)
    return (x[:96], y[:96]), (x[96:], y[96:])


def test_python_loggers_hold_results(tmp_path):
    out = tmp_path / "run"
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)
    )
    with espn.ContinualLearner(
        espn.wrap(model, torch.zeros(2, 1, 8, 8)),
        "espn",
        epochs=(1, 1, 1),
        out=out,
        loggers=["tensorboard", "csv"],
        log_every=2,
    ) as learner:
        for seed in range(2):
            train, test = task_data(seed)
            learner.learn(train, test=test)
    doc = json.loads((out / "results.json").read_text())
    assert doc["accuracy_matrix"] == learner.accuracy_matrix
    assert_logs_hold(out, doc, log_every=2)
