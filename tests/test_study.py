"""The appendix experiment as a command: ``espn study pruners`` and its one-task benchmark."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from typer.testing import CliRunner

import espn.experiment as experiment_module
from espn.cli.main import app
from espn.config import ConfigError, make_config
from espn.data import BENCHMARKS, BenchmarkArgs
from espn.data.mnist import NORMALISATION
from espn.studies.pruners import read_csv

runner = CliRunner()
STUDY = [
    "study",
    "pruners",
    "--model",
    "fc-small",
    "--epochs",
    "1,1,1",
    "--batch-size",
    "128",
    "--train-per-task",
    "128",
    "--test-per-task",
    "100",
    "--gammas",
    "0.05,0.3",
    "--no-progress",
    "--workers",
    "1",  # in this process: the fake data and model are patched in here
]


@pytest.fixture(autouse=True)
def small_model(fc_small_model):
    """Every test here may run model ``fc-small``."""


def test_fashion_mnist_is_one_plain_ten_class_task(fake_mnist):
    seq = BENCHMARKS.get("fashion-mnist").build(BenchmarkArgs(train_per_task=100))
    assert len(seq) == 1 and not seq.multi_head
    (task,) = seq.tasks
    assert task.n_classes == 10 and len(task.train) == 100 and len(task.test) == 200
    raw = fake_mnist["train"][0][task.train.index[:5]]
    mean, std = NORMALISATION["fashion-mnist"]
    expected = ((raw.float() / 255 - mean) / std).unsqueeze(1)
    torch.testing.assert_close(task.transform(raw, True), expected)  # no permutation
    with pytest.raises(ConfigError, match="tasks must be <= 1 for fashion-mnist, got 2"):
        make_config(benchmark="fashion-mnist", tasks=2)


def test_study_pruners_writes_csv_plot_and_one_run_per_point(fake_mnist, tmp_path, monkeypatch):
    out = tmp_path / "study"
    result = runner.invoke(app, [*STUDY, "--out", str(out)])
    assert result.exit_code == 0, result.output
    points = read_csv(out / "pruners.csv")
    assert [(p.pruner, p.gamma) for p in points] == [
        (pruner, gamma) for pruner in ("flop-aware", "l1", "polarization") for gamma in (0.05, 0.3)
    ]
    with (out / "pruners.csv").open() as fh:
        assert next(csv.reader(fh)) == [
            "pruner",
            "gamma",
            "accuracy",
            "flops_ratio",
            "units_kept",
            "seconds",
            "run",
        ]
    for p in points:
        doc = json.loads((out / p.run / "results.json").read_text())
        assert doc["method"] == "individual" and doc["config"]["method_options"]["pruner"] == p.pruner
        assert (
            doc["gamma"] == p.gamma and doc["alpha"] == 1.0 and doc["benchmark"] == "fashion-mnist"
        )
        assert p.accuracy == doc["final_accuracy"][0]
        assert p.flops_ratio <= p.gamma  # every pruner meets its FLOPs target
        assert p.units_kept == doc["units_kept"][0] and 0 < p.units_kept < 1
    for pruner in ("flop-aware", "l1", "polarization"):  # a smaller budget keeps fewer units
        kept = {p.gamma: p.units_kept for p in points if p.pruner == pruner}
        assert kept[0.05] < kept[0.3]
    assert (out / "pruners.png").stat().st_size > 5000
    assert "units kept" in result.output

    def no_training(*args, **kwargs):
        raise AssertionError("a finished point was trained again")

    real_run = experiment_module.run_experiment
    monkeypatch.setattr(experiment_module, "run_experiment", no_training)
    again = runner.invoke(app, [*STUDY, "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert again.output.count("(reused)") == 6
    assert read_csv(out / "pruners.csv") == points
    monkeypatch.setattr(experiment_module, "run_experiment", real_run)
    other = runner.invoke(app, [*STUDY, "--out", str(out), "--seed", "1"])  # points redone
    assert other.exit_code == 0, other.output
    assert "(reused)" not in other.output
    assert all(
        json.loads((out / p.run / "results.json").read_text())["seed"] == 1
        for p in read_csv(out / "pruners.csv")
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gammas", "0.1,abc"], "--gammas must be numbers in (0, 1] separated by commas"),
        (["--gammas", "0.1,1.5"], "--gammas: every gamma must be in (0, 1], got 1.5"),
        (["--gammas", "0"], "every gamma must be in (0, 1], got 0"),
        (["--pruners", "l1,magic"], "unknown pruner 'magic'; choose one of: flop-aware"),
        (["--benchmark", "nope"], "unknown benchmark 'nope'"),
        (["--model", "huge"], "unknown model 'huge'"),
    ],
)
def test_bad_study_options_are_rejected(tmp_path, args, message):
    result = runner.invoke(app, ["study", "pruners", "--out", str(tmp_path / "s"), *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "s" / "pruners.csv").exists()
