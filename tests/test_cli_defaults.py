"""Defaults a user can see: each benchmark's default model in ``espn list``; a warning for
``--amp`` on a CPU."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import espn.api.experiment
from espn.cli.main import app
from espn.data.registry import BENCHMARKS

runner = CliRunner()


def test_espn_list_names_each_benchmarks_default_model():
    result = runner.invoke(app, ["list"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    rows: dict[str, str] = {}
    name = None
    for line in result.output.splitlines():  # a wrapped cell goes on in the next lines
        cells = [c.strip() for c in line.split("│")[1:-1]] if "│" in line else []
        if cells and cells[0] == "benchmark":
            name = cells[1]
            rows[name] = cells[2]
        elif cells and not cells[0] and name is not None:
            rows[name] = f"{rows[name]} {cells[2]}".strip()
        else:
            name = None
    assert set(rows) == set(BENCHMARKS)
    assert "5 tasks and model resnet18-reduced by default" in rows["split-fashion-mnist"]
    assert "36 tasks and model fc1024 by default" in rows["permuted-fashion-mnist"]
    assert "1 task and model fc1024 by default" in rows["tensors"]  # the mnist recipe's
    for name, text in rows.items():
        model = BENCHMARKS.get(name).defaults.get("model")
        assert model is None or f"model {model} by default" in text


class Stop(Exception):
    pass


@pytest.mark.parametrize("amp", [True, False])
def test_amp_on_a_cpu_warns(monkeypatch, tmp_path, amp):
    def fake_run(cfg, *args, **kwargs):  # the run itself is not what is tested
        raise Stop

    monkeypatch.setattr(espn.api.experiment, "run_experiment", fake_run)
    args = ["run", "--benchmark", "permuted-mnist", "--out", str(tmp_path / "o")]
    result = runner.invoke(app, [*args, *(["--amp"] if amp else [])], env={"ESPN_DEBUG": "1"})
    assert isinstance(result.exception, Stop), result.output
    text = " ".join(result.output.split())
    warned = "warning: --amp on a CPU autocasts to bfloat16" in text
    assert warned == amp
