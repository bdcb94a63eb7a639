"""Every command that reads a run takes its directory the same way: positional (``espn info
DIR``), with ``--run DIR`` kept as an alias; ``espn show`` prints the accuracy matrix."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from espn.cli.main import app

runner = CliRunner()


def table_rows(text: str) -> list[list[str]]:
    """The cells of every table row (header rows too) printed in ``text``."""
    lines = [line.replace("┃", "│") for line in text.splitlines()]
    return [[c.strip() for c in line.split("│")[1:-1]] for line in lines if "│" in line]


@pytest.mark.parametrize("command", ["show", "info", "evaluate"])
def test_the_run_directory_is_positional_and_run_is_an_alias(cli_run, command):
    positional = runner.invoke(app, [command, str(cli_run)])
    assert positional.exit_code == 0, positional.output
    alias = runner.invoke(app, [command, "--run", str(cli_run)])
    assert alias.exit_code == 0, alias.output
    assert alias.output == positional.output


def test_export_takes_the_run_directory_positionally(cli_run, tmp_path):
    out = tmp_path / "t1.pt2"
    args = ["export", str(cli_run), "--task", "1", "--out", str(out), "--no-onnx"]
    result = runner.invoke(app, [*args, "--no-check-data"])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 0 and f"task1:wrote{out}" in "".join(result.output.split())


@pytest.mark.parametrize("command", ["show", "info", "evaluate", "export"])
def test_no_or_two_run_directories_are_refused(cli_run, tmp_path, command):
    extra = ["--task", "0", "--out", str(tmp_path / "x.pt2")] if command == "export" else []
    none = runner.invoke(app, [command, *extra])
    assert none.exit_code == 2
    assert "error: missing the run directory: give it as RUN_DIR" in none.output
    two = runner.invoke(app, [command, str(cli_run), "--run", str(tmp_path), *extra])
    assert two.exit_code == 2
    assert f"two run directories given, {str(cli_run)!r} and --run {str(tmp_path)!r}" in (
        " ".join(two.output.split())
    )


def test_show_prints_the_accuracy_matrix_it_promises(cli_run):
    help_text = " ".join(runner.invoke(app, ["show", "--help"]).output.split())
    assert "accuracy matrix (row t: accuracy of tasks 0..t after learning task t)" in help_text
    result = runner.invoke(app, ["show", str(cli_run)])
    assert result.exit_code == 0, result.output
    matrix = json.loads((cli_run / "results.json").read_text())["accuracy_matrix"]
    rows = table_rows(result.output)
    header = rows.index(["after task", "0", "1", "2"])
    printed = rows[header + 1 : header + 4]
    assert [r[0] for r in printed] == ["0", "1", "2"]
    for t, row in enumerate(matrix):
        assert printed[t][1 : 2 + t] == [f"{v:.2f}" for v in row]
        assert all(cell == "" for cell in printed[t][2 + t :])
