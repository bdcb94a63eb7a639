"""``espn theory ...``: each command on tiny sizes, and bad arguments rejected clearly."""

from __future__ import annotations

import csv
import json
import re

import pytest
from typer.testing import CliRunner

from espn.theory.cli import app
from espn.theory.config import COLUMNS

runner = CliRunner()
SMALL = ["--replicates", "1", "--n-test", "200", "--restarts", "2", "--max-iter", "60"]


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def read(path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def check_outputs(out, name: str, columns: tuple[str, ...], n_rows: int) -> list[dict[str, str]]:
    header, rows = read(out / f"{name}.csv")
    assert header == list(columns)
    assert len(rows) == n_rows
    assert (out / f"{name}.png").stat().st_size > 5000
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((out / f"{name}_summary.json").read_text())
    assert "config" in doc and "summary" in doc
    assert not list(out.glob(".*.tmp"))
    return rows


def test_sample_complexity_command(tmp_path):
    out = tmp_path / "sc"
    args = ["sample-complexity", "--out", str(out), "--d", "10", "--r", "3", "--tasks", "4"]
    args += ["--r-frz", "2", "--ns", "8,32,128", "--no-progress", *SMALL]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = check_outputs(out, "sample_complexity", COLUMNS["sample_complexity"], 2 * 3)
    assert {r["setting"] for r in rows} == {"scratch", "frozen"}
    assert {r["dof"] for r in rows} == {str(4 * 3 + 3 * 10), str(4 * 3 + 1 * 10)}
    assert all(float(r["excess_risk"]) >= 0 for r in rows)
    text = one_line(result.output)
    assert "N*T needed to reach excess risk 0.01" in text and "frozen r_frz=2" in text
    # more data helps: the largest N beats the smallest in both settings
    for setting in ("scratch", "frozen"):
        ex = {int(r["N"]): float(r["excess_risk"]) for r in rows if r["setting"] == setting}
        assert ex[128] < ex[8]

    # the summary can be recomputed from the CSV alone
    (out / "sample_complexity.png").unlink()
    again = runner.invoke(app, ["report", str(out / "sample_complexity.csv")])
    assert again.exit_code == 0, again.output
    assert (out / "sample_complexity.png").exists()
    assert one_line(again.output).split("wrote")[0] == text.split("wrote")[0]


def test_mismatch_command(tmp_path):
    out = tmp_path / "mm"
    args = ["mismatch", "--out", str(out), "--d", "10", "--r", "3", "--tasks", "4"]
    args += ["--r-frz", "2", "--ns", "16,256", "--perturbations", "0,0.5", "--mm-n", "400"]
    args += ["--no-progress", *SMALL]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    # per perturbation: 2 MM rows + 2 curve points; plus 2 scratch points
    rows = check_outputs(out, "mismatch", COLUMNS["mismatch"], 2 * (2 + 2) + 2)
    mm = {
        float(r["perturbation"]): float(r["excess_risk"]) for r in rows if r["setting"] == "mm-test"
    }
    assert mm[0.0] < 1e-6 < 1e-3 < mm[0.5]
    assert "MM (test)" in result.output


def test_task_order_command(tmp_path):
    out = tmp_path / "to"
    args = ["task-order", "--out", str(out), "--d", "8", "--r", "2", "--tasks", "3"]
    args += ["--heads", "2", "--n-max", "120", "--n-min", "20", "--no-progress", *SMALL]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = check_outputs(out, "task_order", COLUMNS["task_order"], 3 * 3)
    assert {r["order"] for r in rows} == {"decreasing", "increasing", "individual"}
    seq = {(r["order"], r["task_id"]): r for r in rows}
    # decreasing: task 0 arrives first with r rows, then one row per arrival (tasks from 0)
    assert [seq["decreasing", i]["rows"] for i in "012"] == ["2", "3", "4"]
    assert [seq["increasing", i]["position"] for i in "012"] == ["3", "2", "1"]
    assert [seq["decreasing", i]["N"] for i in "012"] == ["120", "48", "20"]
    assert "per-head sample sizes by task ID: [120, 48, 20]" in one_line(result.output)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["sample-complexity", "--r", "3", "--r-frz", "4"], ["--r-frz", "[0, r=3]", "got 4"]),
        (["sample-complexity", "--ns", "8,0"], ["--ns", "N must be >= 1", "got 0"]),
        (["sample-complexity", "--ns", "eight"], ["--ns", "integers", "'eight'"]),
        (
            ["sample-complexity", "--activation", "tanh"],
            ["--activation", "'tanh'", "accepted: identity, relu"],
        ),
        (["sample-complexity", "--target", "2"], ["--target", "(0, 1)", "got 2"]),
        (["mismatch", "--r", "4", "--r-frz", "5"], ["--r-frz", "[0, r=4]", "got 5"]),
        (["mismatch", "--perturbations", "0,-1"], ["--perturbations", ">= 0", "got -1"]),
        (["mismatch", "--ns", "-3"], ["--ns", "got -3"]),
        (
            ["mismatch", "--r", "4", "--r-frz", "2", "--r-new", "3"],
            ["--r-new:", "[0, r - r_frz = 2]"],
        ),
        (["mismatch", "--mm-n", "0"], ["--mm-n: must be >= 1, got 0"]),
        (["mismatch", "--noise", "nan"], ["--noise: must be a finite number, got nan"]),
        (["mismatch", "--activation", "gelu"], ["'gelu'", "accepted: identity, relu"]),
        (["task-order", "--orders", "random"], ["--orders", "'random'", "decreasing"]),
        (["task-order", "--n-min", "500", "--n-max", "100"], ["--n-max:", ">= n_min (500)"]),
        (["task-order", "--inputs", "cube"], ["--inputs", "'cube'", "sphere, ball"]),
        (["task-order", "--r", "40", "--d", "30"], ["--r", "[1, d=30]", "got 40"]),
    ],
)
def test_bad_arguments_exit_nonzero_with_clear_message(tmp_path, args, needles):
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "x"), "--no-progress"])
    assert result.exit_code != 0
    text = one_line(result.output)
    for needle in needles:
        assert needle in text, text
    assert not (tmp_path / "x").exists()  # rejected before any work


def test_report_rejects_unknown_files(tmp_path):
    missing = runner.invoke(app, ["report", str(tmp_path / "nope.csv")])
    assert missing.exit_code != 0 and "no such file" in missing.output
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    wrong = runner.invoke(app, ["report", str(other)])
    assert wrong.exit_code != 0 and "match none of the theory experiments" in one_line(wrong.output)
