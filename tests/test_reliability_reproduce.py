"""``espn reproduce report`` refuses run directories it cannot trust (a corrupt
results.json, a run of another point under a point's name) instead of rewriting a complete
table without them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from espn.cli.main import app
from helpers.errors import one_line_error
from test_reproduce import fashion_dir  # noqa: F401  (the module's synthetic Fashion-MNIST)

runner = CliRunner()
TARGET = "fig-task-order"


@pytest.fixture(scope="module")
def reproduced(fashion_dir, tmp_path_factory) -> Path:  # noqa: F811
    from espn.models.registry import MODELS
    from helpers.baseline import fc_small

    out = tmp_path_factory.mktemp("rep")
    args = ["reproduce", TARGET, "--scale", "smoke", "--out", str(out), "--workers", "1"]
    args += ["--model", "fc-small", "--data-dir", str(fashion_dir), "--no-progress"]
    with MODELS.temporarily("fc-small", fc_small):
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def tables(out: Path) -> dict[str, bytes]:
    return {ext: (out / f"{TARGET}.{ext}").read_bytes() for ext in ("csv", "md", "png")}


def test_a_corrupt_results_json_is_named_and_the_table_kept(reproduced, tmp_path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(reproduced, out)
    before = tables(out)
    bad = out / f"{TARGET}__espn-0.2+small-first__seed0" / "results.json"
    bad.write_text(bad.read_text()[:200])
    line = one_line_error(runner.invoke(app, ["reproduce", "report", str(out)]))
    assert f"{TARGET}__espn-0.2+small-first__seed0: " in line and "not valid JSON" in line
    assert "no table was rewritten" in line and tables(out) == before


def test_a_foreign_run_under_a_point_name_is_refused(reproduced, tmp_path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(reproduced, out)
    before = tables(out)
    shutil.copytree(out / f"{TARGET}__espn-0.2+large-first__seed0", out / f"{TARGET}__bogus__seed0")
    line = one_line_error(runner.invoke(app, ["reproduce", "report", str(out)]))
    assert f"{TARGET}__bogus__seed0: its name is not a point of the target" in line
    shutil.rmtree(out / f"{TARGET}__bogus__seed0")
    ours = out / f"{TARGET}__espn-0.2+large-first__seed0"
    shutil.rmtree(ours)
    shutil.copytree(out / f"{TARGET}__individual-1+given__seed0", ours)  # another method's run
    line = one_line_error(runner.invoke(app, ["reproduce", "report", str(out)]))
    assert "espn-0.2+large-first__seed0: it holds a run of" in line and "'individual'" in line
    assert tables(out) == before
    doc = json.loads((ours / "results.json").read_text())
    assert doc["config"]["method"] == "individual"


def test_a_deleted_point_directory_leaves_the_complete_table(reproduced, tmp_path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(reproduced, out)
    before = tables(out)
    gone = f"{TARGET}__espn-0.2+small-first__seed0"
    shutil.rmtree(out / gone)
    line = one_line_error(runner.invoke(app, ["reproduce", "report", str(out)]))
    assert f"{TARGET}'s table was built from 1 run director(ies) that are now missing" in line
    assert f"({gone})" in line and "no table was rewritten" in line
    assert f"delete {TARGET}.points.json" in line
    assert tables(out) == before
    (out / f"{TARGET}.points.json").unlink()  # the user's choice: a table of what is left
    result = runner.invoke(app, ["reproduce", "report", str(out)])
    assert result.exit_code == 0, result.output
    assert tables(out)["csv"] != before["csv"]
    assert json.loads((out / f"{TARGET}.points.json").read_text())["points"] == sorted(
        p.name for p in out.iterdir() if p.is_dir() and p.name.startswith(f"{TARGET}__")
    )
