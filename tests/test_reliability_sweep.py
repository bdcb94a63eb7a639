"""Sweeps that would overwrite, hang or fail obscurely: a finished point whose options
changed is refused without --overwrite, absurd grids and alias bombs are refused before
they are expanded, unreachable Ray targets fail within seconds (exit 2, no Ray process
left), bad sweep options are one-line errors, a corrupt results.json beside an intact
checkpoint is recovered."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from espn.cli.main import app
from espn.sweep import SweepError, expand_spec, run_sweep
from espn.sweep.spec import MAX_POINTS, Point, validate_points
from helpers.errors import one_line_error

runner = CliRunner()
SRC = Path(__file__).resolve().parents[1] / "src"
#: GPUs per point beyond what this machine has (1 where it has none)
MORE_GPUS = torch.cuda.device_count() + 1


def base(**changes) -> dict:
    """A point of seconds on the fake data with the tiny model."""
    return {
        "benchmark": "permuted-mnist",
        "model": "fc-test",
        "tasks": 2,
        "epochs": [1, 1, 1],
        "batch_size": 128,
        "optimizer": "adam",
    } | changes


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture
def tiny(fake_mnist, fc_test_model):
    """Points run in this process on the fake data."""


# ------------------------------------------------------------------ finished points kept
def test_a_finished_point_whose_options_changed_is_not_overwritten(tiny, tmp_path) -> None:
    out = tmp_path / "sweep"
    spec = write_spec(tmp_path / "s.json", {"base": base(), "grid": {"seed": [0, 1]}})
    args = ["sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress"]
    assert runner.invoke(app, args).exit_code == 0
    before = {p: (out / p / "results.json").read_bytes() for p in ("seed0", "seed1")}
    write_spec(spec, {"base": base(epochs=[1, 1, 2]), "grid": {"seed": [0, 1]}})
    line = one_line_error(runner.invoke(app, args))
    assert "2 point(s) hold a run made with other options" in line and "--overwrite" in line
    assert "seed0 (epochs=[1, 1, 1] in the checkpoint, [1, 1, 2] now)" in line
    assert before == {p: (out / p / "results.json").read_bytes() for p in before}
    assert runner.invoke(app, [*args, "--overwrite"]).exit_code == 0
    doc = json.loads((out / "seed0" / "results.json").read_text())
    assert doc["config"]["epochs"] == [1, 1, 2]


def test_a_corrupt_results_json_beside_an_intact_checkpoint_is_recovered(tiny, tmp_path) -> None:
    (point,) = expand_spec({"base": base(), "grid": {"seed": [0]}})
    (first,) = run_sweep([point], tmp_path, workers=1, progress=False)
    results = tmp_path / "seed0" / "results.json"
    results.write_text(results.read_text()[:100])  # truncated
    (again,) = run_sweep([point], tmp_path, workers=1, progress=False)
    assert again.status == "resumed", again.error
    assert again.results["accuracy_matrix"] == first.results["accuracy_matrix"]
    assert json.loads(results.read_text())["accuracy_matrix"] == first.results["accuracy_matrix"]
    (third,) = run_sweep([point], tmp_path, workers=1, progress=False)
    assert third.status == "reused"


# ------------------------------------------------------------------ refused before expanding
def test_a_grid_of_a_million_points_is_refused_before_it_is_expanded() -> None:
    spec = {"base": base(), "grid": {"seed": list(range(1000)), "task_seed": list(range(1000))}}
    with pytest.raises(SweepError, match=f"1000000 points .*more than the {MAX_POINTS}"):
        expand_spec(spec)


def test_repeated_names_among_many_points_are_found_in_one_pass() -> None:
    points = [Point(f"p{i % 5000}", base(seed=i)) for i in range(MAX_POINTS)]
    with pytest.raises(SweepError, match="point name"):
        validate_points(points)


def test_a_yaml_alias_bomb_is_refused_before_naming_points(tmp_path) -> None:
    lines = ["grid:", "  seed: [0]", "  lr:", "    - &a [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    previous = "a"
    for name in "bcdefgh":
        lines.append(f"    - &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
        previous = name
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size < 600
    line = one_line_error(runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "o")]))
    assert "more than 100000 values once its YAML aliases are expanded" in line


# ------------------------------------------------------------------ sweep options
@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--cpus-per-run", "nan", "cpus_per_run must be a number in (0, 1024], got nan"),
        ("--cpus-per-run", "inf", "cpus_per_run must be a number in (0, 1024], got inf"),
        ("--gpus-per-run", "nan", "gpus_per_run must be a number in [0, 1024], got nan"),
    ],
)
def test_non_finite_resources_are_refused(tmp_path, flag, value, message) -> None:
    spec = write_spec(tmp_path / "s.json", {"base": base(model="fc1024")})
    line = one_line_error(
        runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path), flag, value])
    )
    assert message in line


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.with_suffix(".json").write_bytes(b"\xff\xfe\x00binary"), "is not a text file"),
        (lambda p: p.with_suffix(".json").mkdir(), "is a directory; give a .json or .yaml file"),
    ],
)
def test_spec_files_that_are_not_specs(tmp_path, make, message) -> None:
    make(tmp_path / "spec")
    line = one_line_error(runner.invoke(app, ["sweep", str(tmp_path / "spec.json"), "--out", "o"]))
    assert message in line


def test_two_epochs_say_three_are_needed(tmp_path) -> None:
    spec = write_spec(tmp_path / "s.json", {"base": base(model="fc1024", epochs=[1, 1])})
    line = one_line_error(runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o")]))
    assert "epochs must be three non-negative counts (pre-train, prune, fine-tune), got 2" in line


# ------------------------------------------------------------------ Ray targets that hang
def _group(pgid: int) -> dict[int, str]:
    """The live processes of process group ``pgid``: pid -> command line."""
    alive = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                cmdline = (stat.parent / "cmdline").read_bytes()
                alive[int(stat.parent.name)] = cmdline.replace(b"\0", b" ").decode()
        except OSError:
            continue
    return alive


def sweep_process(tmp_path: Path, flags: list[str], stdout: int) -> subprocess.Popen[str]:
    """``espn sweep`` of two points on two Ray workers in a new process group (every
    process it starts is in that group)."""
    spec = write_spec(tmp_path / "s.json", {"base": base(model="fc1024"), "grid": {"seed": [0, 1]}})
    args = ["sweep", str(spec), "--out", str(tmp_path / "o"), "--workers", "2", *flags]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(SRC), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-m", "espn.cli.main", *args],
        stdout=stdout,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ray-address", "127.0.0.1:1"], "no Ray cluster answers at 127.0.0.1:1"),
        (
            ["--gpus-per-run", str(MORE_GPUS)],
            f"gpus_per_run {MORE_GPUS} asks each point for more GPUs than",
        ),
    ],
)
def test_unreachable_ray_targets_fail_within_seconds(tmp_path, flags, message) -> None:
    pytest.importorskip("ray")
    proc = sweep_process(tmp_path, flags, subprocess.PIPE)
    try:
        output, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in " ".join(errors[0].split()), output
    assert _group(proc.pid) == {}


@pytest.mark.slow
def test_no_ray_process_survives_a_sigkill_of_the_sweep(tmp_path) -> None:
    """Ray's agents outlived a killed driver; the sweep's watchdog removes them."""
    import signal
    import time

    pytest.importorskip("ray")
    proc = sweep_process(tmp_path, [], subprocess.DEVNULL)
    try:
        for _ in range(240):  # until Ray's agents run
            if any("agent" in c for c in _group(proc.pid).values()):
                break
            time.sleep(0.5)
        assert any("agent" in c for c in _group(proc.pid).values()), "Ray did not start"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for _ in range(40):
            if not _group(proc.pid):
                break
            time.sleep(0.5)
        assert _group(proc.pid) == {}
    finally:
        for pid in _group(proc.pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("checkpoint", [True, False])
def test_a_point_whose_results_hold_nan_is_run_again(tiny, tmp_path, checkpoint) -> None:
    """NaN accuracies and an infinite wall time in a finished point's results.json (espn
    never writes them): the point is not reused but resumed from its checkpoint (or run
    again without one), and neither its table nor the summary shows a nan."""
    out = tmp_path / "sweep"
    spec = write_spec(tmp_path / "s.json", {"base": base(), "grid": {"seed": [0]}})
    args = ["sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress"]
    assert runner.invoke(app, args).exit_code == 0
    results = out / "seed0" / "results.json"
    good = json.loads(results.read_text())
    doc = json.loads(results.read_text()) | {"average_accuracy": math.nan, "wall_time_s": math.inf}
    doc["accuracy_matrix"][0][0] = float("nan")
    results.write_text(json.dumps(doc))  # NaN and Infinity, as Python's json writes them
    if not checkpoint:
        shutil.rmtree(out / "seed0" / "checkpoint")
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "reused" not in result.output and ("resumed" if checkpoint else "done") in result.output
    again = json.loads(results.read_text())
    assert again["accuracy_matrix"] == good["accuracy_matrix"]
    assert math.isfinite(again["average_accuracy"]) and math.isfinite(again["wall_time_s"])
    summary = (out / "summary.md").read_text() + (out / "summary.csv").read_text()
    for text in (result.output, summary):
        assert re.search(r"\b(nan|inf|infinity)\b", text, re.IGNORECASE) is None, text
    if checkpoint:
        log = (out / "seed0" / "log.txt").read_text()
        assert re.search(r"results.json was not used \(it holds \S+ = (nan|inf)\)", log), log
