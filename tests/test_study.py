"""The appendix experiment (``espn reproduce fig-pruners``) and its one-task benchmark."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from typer.testing import CliRunner

import espn.api.experiment as experiment_module
from espn.cli.main import app
from espn.data import BENCHMARKS, BenchmarkArgs
from espn.data.mnist import NORMALISATION
from espn.reproduce.target import point_name
from espn.runs.config import ConfigError, make_config

runner = CliRunner()
STUDY = ["reproduce", "fig-pruners", "--scale", "smoke", "--model", "fc-small"]
STUDY += ["--no-progress", "--workers", "1"]  # in this process: the fake data are patched in


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


def test_pruner_study_runs_one_individual_run_per_pruner_and_gamma(
    fake_mnist, tmp_path, monkeypatch
):
    """The appendix experiment (once ``espn study pruners``) is the ``fig-pruners`` target:
    one Individual-gamma run of the first task per (pruner, gamma), each meeting its budget,
    reused when run again."""
    out = tmp_path / "study"
    result = runner.invoke(app, [*STUDY, "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "fig-pruners.csv").open()))
    gammas = (0.1, 0.5)
    pruners = ("flop-aware", "l1", "polarization")
    assert [(r["pruner"], float(r["gamma"])) for r in rows] == [
        (p, g) for p in pruners for g in gammas
    ]
    kept: dict[tuple[str, float], float] = {}
    for pruner in pruners:
        for gamma in gammas:
            name = point_name("fig-pruners", f"{pruner}+gamma{gamma:g}", 0)
            doc = json.loads((out / name / "results.json").read_text())
            assert (
                doc["method"] == "individual"
                and doc["config"]["method_options"]["pruner"] == pruner
            )
            assert doc["config"]["tasks"] == 1 and doc["benchmark"] == "fashion-mnist"
            assert doc["gamma"] == gamma and doc["alpha"] == 1.0
            assert doc["flops_ratio"][0] <= gamma  # every pruner meets its FLOPs target
            assert 0 < doc["units_kept"][0] < 1
            kept[pruner, gamma] = doc["units_kept"][0]
            row = next(r for r in rows if r["pruner"] == pruner and float(r["gamma"]) == gamma)
            assert float(row["accuracy"]) == doc["final_accuracy"][0]
    assert all(kept[p, 0.1] < kept[p, 0.5] for p in pruners)  # a smaller budget keeps fewer
    assert (out / "fig-pruners.png").stat().st_size > 5000

    def no_training(*args, **kwargs):
        raise AssertionError("a finished point was trained again")

    monkeypatch.setattr(experiment_module, "run_experiment", no_training)
    again = runner.invoke(app, [*STUDY, "--out", str(out)])
    assert again.exit_code == 0 and again.output == result.output
