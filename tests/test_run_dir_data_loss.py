"""No command loses files it was not asked to replace (issue 37, items 5, 7 and 8; item 6,
``reproduce report``, is in test_reliability_reproduce): an export never writes over a
run directory's files nor silently over an earlier export, a sweep never follows a linked
point directory out of ``--out``, and ``--from-run SRC`` never writes inside SRC."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from espn.cli.main import app
from espn.export.export import onnx_available
from espn.sweep import run_sweep
from espn.sweep.spec import Point, SweepError
from helpers.deploy import cli_options
from helpers.errors import one_line_error

runner = CliRunner()


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (through no link) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def export(run: Path, out: Path, *extra: str):
    return runner.invoke(
        app, ["export", "--run", str(run), "--task", "0", "--out", str(out), *extra]
    )


# ------------------------------------------------------------------ 5: export
@pytest.mark.parametrize(
    ("target", "hit"),
    [
        ("results.pt2", "results.json"),
        ("results.onnx", "results.json"),
        ("checkpoint/manifest.pt2", "checkpoint/manifest.pt2"),
        ("checkpoint/state-000001.onnx", "checkpoint/state-000001.onnx"),
    ],
)
@pytest.mark.parametrize("overwrite", [False, True])
def test_export_never_writes_over_a_run_directorys_files(run_copy, target, hit, overwrite) -> None:
    before = snapshot(run_copy)
    args = ["--overwrite"] if overwrite else []
    line = one_line_error(export(run_copy, run_copy / target, *args))
    assert f"would write {run_copy / hit}, a file of the run directory {run_copy}" in line
    assert snapshot(run_copy) == before


def test_export_into_another_run_directory_is_refused_too(run_copy, finished_run, tmp_path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_bytes((finished_run / "results.json").read_bytes())
    line = one_line_error(export(run_copy, other / "results.pt2", "--overwrite"))
    assert f"a file of the run directory {other}" in line


def test_export_replaces_an_earlier_export_only_when_told(run_copy, tmp_path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "mine.onnx").write_bytes(b"an earlier onnx")
    (out / "mine.json").write_bytes(b"{}")
    line = one_line_error(export(run_copy, out / "mine.pt2"))
    # the ONNX file is part of an export only where the onnx extra is installed
    replaced = [out / "mine.onnx", out / "mine.json"] if onnx_available() else [out / "mine.json"]
    assert f"would replace {', '.join(map(str, replaced))}" in line
    assert "--overwrite" in line
    assert (out / "mine.onnx").read_bytes() == b"an earlier onnx"
    assert not (out / "mine.pt2").exists()
    result = export(run_copy, out / "mine.pt2", "--no-onnx", "--overwrite")
    assert result.exit_code == 0, result.output
    assert (out / "mine.pt2").is_file() and (out / "mine.json").read_bytes() != b"{}"
    assert (out / "mine.onnx").read_bytes() == b"an earlier onnx"  # --no-onnx: not written


def test_an_export_inside_the_run_directory_may_be_replaced(run_copy) -> None:
    first = export(run_copy, run_copy / "exports" / "t0.pt2", "--no-onnx")
    assert first.exit_code == 0, first.output
    again = export(run_copy, run_copy / "exports" / "t0.pt2", "--no-onnx", "--overwrite")
    assert again.exit_code == 0, again.output


# ------------------------------------------------------------------ 7: sweep links
def test_sweep_overwrite_does_not_follow_a_linked_point_directory(run_copy, tmp_path) -> None:
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "seed0").symlink_to(run_copy, target_is_directory=True)
    before = snapshot(run_copy)
    point = Point(
        "seed0",
        {
            "benchmark": "permuted-mnist",
            "model": "fc-test",
            "tasks": 2,
            "epochs": [1, 1, 1],
            "batch_size": 128,
        },
    )
    with pytest.raises(SweepError, match=r"is a link to .*; a sweep reads and writes only inside"):
        run_sweep([point], out, workers=1, progress=False, overwrite=True)
    assert snapshot(run_copy) == before


# ------------------------------------------------------------------ 8: --from-run
@pytest.mark.parametrize("inside", ["checkpoint", "deeper/still"])
def test_from_run_refuses_an_out_inside_the_source(run_copy, inside) -> None:
    before = snapshot(run_copy)
    args = [*cli_options(run_copy / inside), "--from-run", str(run_copy), "--after-task", "1"]
    line = one_line_error(runner.invoke(app, args))
    assert f"is inside from_run {run_copy}" in line and "outside it" in line
    assert snapshot(run_copy) == before
