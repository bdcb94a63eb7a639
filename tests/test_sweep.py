"""Sweeps: specs expanded into named points, validated up front, and run on a local Ray
(one instance for the whole module) exactly as one by one; finished points are reused,
killed ones resumed, failed ones reported with their log."""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from espn.cli.main import app
from espn.sweep import Point, SweepError, expand_spec, load_spec, run_sweep
from espn.sweep.runner import NO_RAY_NOTE, RAY_MISSING
from helpers.deploy import kill_at_step
from helpers.mnist import synthetic_mnist

runner = CliRunner()


def write_idx(path: Path, data: torch.Tensor) -> None:
    """An uncompressed IDX file (the MNIST format) of a uint8 tensor."""
    header = bytes([0, 0, 8, data.dim()]) + b"".join(n.to_bytes(4, "big") for n in data.shape)
    path.write_bytes(header + data.to(torch.uint8).numpy().tobytes())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Synthetic MNIST on disk, so that Ray's worker processes read it too."""
    root = tmp_path_factory.mktemp("data")
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    data = synthetic_mnist()
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x, y = data[split]
        write_idx(raw / f"{prefix}-images-idx3-ubyte", x)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", y)
    return root


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray with 2 CPUs for the module (starting one takes seconds)."""
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=128 * 2**20,
        configure_logging=False,
    )
    yield ray
    ray.shutdown()


def base_options(data_dir: Path) -> dict:
    """A run of seconds: 2 tasks of 128 images, 2 steps per epoch, 6 steps per task."""
    return {
        "benchmark": "permuted-mnist",
        "model": "fc1024",
        "tasks": 2,
        "epochs": [1, 1, 1],
        "train_per_task": 128,
        "test_per_task": 100,
        "batch_size": 64,
        "optimizer": "adam",
        "data_dir": str(data_dir),
    }


def four_points(data_dir: Path) -> list[Point]:
    spec = {"base": base_options(data_dir), "grid": {"method": ["espn", "packnet"], "seed": [0, 1]}}
    return expand_spec(spec)


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread, as in Ray's workers: a run's float sums then do not depend on
    where it ran (two threads split some reductions differently)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_by_one(tmp_path_factory) -> Callable[[Point], dict]:
    """A point's results when run alone in this process (one thread, as on Ray), cached."""
    done: dict[str, dict] = {}

    def results(point: Point) -> dict:
        if point.name not in done:
            with one_thread():
                (outcome,) = run_sweep(
                    [point], tmp_path_factory.mktemp("ref"), workers=1, progress=False
                )
            assert outcome.status == "done", outcome.error
            done[point.name] = outcome.results
        return done[point.name]

    return results


# ------------------------------------------------------------------ specs
def test_a_grid_is_the_cartesian_product_with_readable_names(tmp_path):
    points = expand_spec(
        {
            "base": {"benchmark": "permuted-mnist", "tasks": 2},
            "grid": {"method": ["espn", "packnet"], "alpha": [0.2, 0.5], "seed": [0, 1]},
        }
    )
    assert [p.name for p in points[:3]] == [
        "espn_alpha0.2_seed0",
        "espn_alpha0.2_seed1",
        "espn_alpha0.5_seed0",
    ]
    assert len(points) == 8 and len({p.name for p in points}) == 8
    assert points[5].options == {
        "benchmark": "permuted-mnist",
        "tasks": 2,
        "method": "packnet",
        "alpha": 0.2,
        "seed": 1,
    }
    named = expand_spec(
        {"base": {"benchmark": "permuted-mnist"}, "grid": {"alpha": [0.1]}, "name": "a/{alpha}"}
    )
    assert [p.name for p in named] == ["a-0.1"]  # made safe for a directory name


def test_yaml_and_json_specs_read_alike(tmp_path):
    (tmp_path / "s.yaml").write_text(
        "base:\n  benchmark: permuted-mnist\n  epochs: [1, 1, 1]\ngrid:\n  seed: [0, 1]\n"
    )
    (tmp_path / "s.json").write_text(
        json.dumps(
            {"base": {"benchmark": "permuted-mnist", "epochs": [1, 1, 1]}, "grid": {"seed": [0, 1]}}
        )
    )
    assert load_spec(tmp_path / "s.yaml") == load_spec(tmp_path / "s.json")
    assert [p.name for p in expand_spec(load_spec(tmp_path / "s.yaml"))] == ["seed0", "seed1"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([1, 2], "a sweep spec must be a mapping"),
        ({"base": {}, "grids": {}}, "unknown sweep spec key(s) grids; accepted: base, grid, name"),
        ({"base": {"benchmark": "permuted-mnist", "speed": 3}}, "unknown option 'speed'"),
        ({"base": {"benchmark": "permuted-mnist", "out": "x"}}, "unknown option 'out'"),
        (
            {"base": {"benchmark": "permuted-mnist"}, "grid": {"seed": 3}},
            "grid 'seed' must be a non-empty list",
        ),
        ({"base": {"benchmark": "permuted-mnist"}, "grid": {"seed": []}}, "non-empty list"),
        (
            {"base": {"benchmark": "permuted-mnist", "seed": 1}, "grid": {"seed": [0]}},
            "seed in both 'base' and 'grid'",
        ),
        (
            {"base": {"benchmark": "permuted-mnist"}, "grid": {"seed": [0, 1]}, "name": "x"},
            "point name(s) x given more than once",
        ),
        (
            {"base": {"benchmark": "permuted-mnist"}, "grid": {"seed": [0]}, "name": "{gamma}"},
            "uses 'gamma', which is not a grid key",
        ),
        (
            {"base": {"benchmark": "permuted-mnist"}, "grid": {"gamma": [0.2, 1.5]}},
            "point gamma1.5: gamma: gamma must be in (0, 1], got 1.5",  # its declaration's
        ),
        (
            {
                "base": {"benchmark": "permuted-mnist"},
                "grid": {"method": ["individual", "mtl"], "alpha": [0.5]},
            },
            "point mtl_alpha0.5: config: method 'mtl' has no weight budget",
        ),
        ({"grid": {"seed": [0]}}, "point seed0: config: no benchmark"),
    ],
)
def test_bad_specs_are_refused_before_anything_runs(tmp_path, spec, message):
    with pytest.raises(SweepError) as err:
        expand_spec(spec)
    assert message in str(err.value)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    result = runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()


def test_bad_spec_files_and_sweep_options(tmp_path, data_dir):
    (tmp_path / "s.toml").write_text("")
    (tmp_path / "bad.json").write_text("{")
    for path, message in (
        (tmp_path / "missing.json", "does not exist"),
        (tmp_path / "s.toml", "unknown format '.toml'"),
        (tmp_path / "bad.json", "is not valid JSON"),
    ):
        with pytest.raises(SweepError, match=message):
            load_spec(path)
    points = four_points(data_dir)
    with pytest.raises(SweepError, match="workers must be >= 1, got 0"):
        run_sweep(points, tmp_path / "o", workers=0)
    with pytest.raises(SweepError, match=r"cpus_per_run must be a number in \(0, 1024\], got 0"):
        run_sweep(points, tmp_path / "o", cpus_per_run=0)
    with pytest.raises(SweepError, match="'out' is set by the sweep"):
        run_sweep([Point("p", {"benchmark": "permuted-mnist", "out": "x"})], tmp_path / "o")
    with pytest.raises(SweepError, match="not a safe directory name"):
        run_sweep([Point("../p", {"benchmark": "permuted-mnist"})], tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_without_ray_the_points_run_in_this_process_and_say_so(
    tmp_path, data_dir, one_by_one, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    points = four_points(data_dir)[:2]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_by_one runs them
    try:
        outcomes = run_sweep(points, tmp_path / "o", workers=2, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert NO_RAY_NOTE.format(n=2) in " ".join(capsys.readouterr().out.split())
    for o in outcomes:
        assert o.status == "done", o.error
        assert o.results["accuracy_matrix"] == one_by_one(o.point)["accuracy_matrix"]
    with pytest.raises(SweepError) as err:  # a cluster cannot be reached without Ray
        run_sweep(points, tmp_path / "p", ray_address="auto", progress=False)
    assert str(err.value) == RAY_MISSING and "pip install 'espn[ray]'" in RAY_MISSING


# ------------------------------------------------------------------ on Ray
@pytest.mark.slow  # starts Ray, about 20 s
def test_four_points_on_two_ray_workers_equal_one_by_one(
    ray_instance, data_dir, one_by_one, tmp_path
):
    outcomes = run_sweep(four_points(data_dir), tmp_path / "sweep", workers=2, progress=False)
    assert [o.status for o in outcomes] == ["done"] * 4
    for o in outcomes:
        assert o.run_dir == (tmp_path / "sweep" / o.point.name).resolve()
        doc = json.loads((o.run_dir / "results.json").read_text())
        assert doc == o.results and doc["complete"]
        assert doc["accuracy_matrix"] == one_by_one(o.point)["accuracy_matrix"]
        assert doc["method"] == o.point.options["method"]
        assert "finished in" in o.log.read_text()
    again = run_sweep(four_points(data_dir), tmp_path / "sweep", workers=2, progress=False)
    assert [o.status for o in again] == ["reused"] * 4
    assert [o.results for o in again] == [o.results for o in outcomes]


def test_a_point_killed_mid_sweep_is_resumed_not_restarted(
    ray_instance, data_dir, one_by_one, tmp_path, monkeypatch
):
    points = four_points(data_dir)[:2]
    with monkeypatch.context() as mp, one_thread():  # the first point dies in its second task
        kill_at_step(mp, 9)
        first = run_sweep(points, tmp_path, workers=1, progress=False)
    assert [o.status for o in first] == ["failed", "done"]
    assert "Killed" in first[0].error and first[0].log.is_file()
    assert (first[0].run_dir / "checkpoint" / "manifest.json").is_file()

    second = run_sweep(points, tmp_path, workers=2, progress=False)
    assert [o.status for o in second] == ["resumed", "reused"]
    log = second[0].log.read_text()
    after = log[log.rindex("resumed from") :]
    assert "1/2 tasks done; task 1 continues at the start of its prune phase" in after
    # task 0 was not learned again
    assert "(1/2 done)" not in after and "task 1 (2/2 done)" in after
    assert second[0].results["accuracy_matrix"] == one_by_one(points[0])["accuracy_matrix"]


def test_a_failing_point_does_not_stop_the_others(ray_instance, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(data_dir.parent)  # a relative data_dir means the same in Ray's workers
    spec = {
        "base": {**base_options(Path(data_dir.name)), "method": "espn", "tasks": 1},
        "grid": {"gamma": [0.5, 1e-5, 0.2]},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["sweep", str(tmp_path / "spec.json"), "--out", str(out), "--workers", "2"]
    )
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    log = (out / "gamma1e-05" / "log.txt").resolve()
    assert "1 of 3 point(s) failed: gamma1e-05 (ConfigError: gamma 1e-05 is below" in text
    assert f"log: {log})" in result.output
    assert "Traceback" in log.read_text()
    for name in ("gamma0.5", "gamma0.2"):
        doc = json.loads((out / name / "results.json").read_text())
        assert doc["complete"] and doc["config"]["data_dir"] == str(data_dir)
    assert "done gamma0.5:" in text and "failed gamma1e-05:" in text


# ------------------------------------------------------------------ summary across seeds
def test_a_default_sweep_runs_in_process_and_summarises_each_series(
    data_dir, tmp_path, monkeypatch
):
    """Without --workers or a cluster no Ray starts; OUT/summary.csv/.md/.png hold per
    series (points differing only in seed) the mean, standard error and count, equal to
    those computed from the points' own results.json."""
    import espn.sweep.runner as sweep_runner

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started for an in-process sweep")

    monkeypatch.setattr(sweep_runner, "_run_on_ray", no_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = {"base": base_options(data_dir), "grid": {"method": ["espn", "packnet"], "seed": [0, 1]}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(tmp_path / "spec.json"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Ray is not installed" not in result.output
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [(r["series"], r["method"], r["runs"]) for r in rows] == [
        ("method=espn", "espn", "2"),
        ("method=packnet", "packnet", "2"),
    ]
    for row in rows:
        accs = [
            json.loads((out / f"{row['method']}_seed{s}" / "results.json").read_text())[
                "average_accuracy"
            ]
            for s in (0, 1)
        ]
        assert float(row["average_accuracy"]) == pytest.approx(statistics.mean(accs))
        se = statistics.stdev(accs) / math.sqrt(2)
        assert float(row["average_accuracy_se"]) == pytest.approx(se)
        assert row["average_accuracy_n"] == "2" and row["failed"] == "0"
    md = (out / "summary.md").read_text()
    espn_row = rows[0]
    mean, se = float(espn_row["average_accuracy"]), float(espn_row["average_accuracy_se"])
    assert f"| method=espn | 2 | 0 | {mean:.2f} ± {se:.2f} |" in md
    assert (out / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert f"wrote{out / 'summary.csv'}," in "".join(result.output.split())


def test_a_sweep_point_is_learned_by_the_one_learner(
    tmp_path, fake_mnist, fc_test_model, monkeypatch
):
    """Each point's tasks go through ``ContinualLearner.learn_sequence`` and are trained for
    that learner (the engine's owner), as the point's results.json names them."""
    from helpers.learner_spy import LearnerSpy

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # in this process
    spy = LearnerSpy(monkeypatch)
    base = {"benchmark": "permuted-mnist", "model": fc_test_model, "tasks": 2, "epochs": [1, 1, 1]}
    base |= {"train_per_task": 64, "test_per_task": 32, "batch_size": 32}
    points = expand_spec({"base": base, "grid": {"method": ["espn", "packnet"]}})
    outcomes = run_sweep(points, tmp_path / "o", progress=False)
    assert [o.status for o in outcomes] == ["done", "done"]
    names = [o.results["task_names"] for o in outcomes]
    assert spy.sequences == names and all(len(n) == 2 for n in names)
    assert [name for name, _ in spy.trained] == names[0] + names[1] and spy.trained_by_learner
