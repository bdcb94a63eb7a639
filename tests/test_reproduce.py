"""``espn reproduce``: targets at smoke scale write their CSV, markdown and figure; ``report``
rebuilds them from the run directories alone; aggregation and the paper's numbers."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from espn.cli.main import app
from espn.reproduce import (
    SCALES,
    TARGETS,
    Options,
    ReproduceError,
    Run,
    paper_numbers,
    run_target,
)
from espn.reproduce import report as rebuild
from espn.reproduce.representation import IMAGENET_TASKS, small_task_accuracies
from espn.reproduce.target import parse_name, point_name
from espn.reproduce.task_order import by_size_rank
from espn.runs.config import make_config
from espn.utils.stats import mean_se
from helpers.mnist import synthetic_mnist

runner = CliRunner()
ALL = [
    "table1",
    "fig-mnist",
    "fig-pruners",
    "fig-alpha-gamma",
    "table-imagenet",
    "fig-data-efficiency",
    "fig-task-order",
]


def write_idx(path: Path, array: torch.Tensor) -> None:
    """An uncompressed IDX file (the MNIST format) of a uint8 tensor."""
    header = bytes([0, 0, 8, array.dim()]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    path.write_bytes(header + array.to(torch.uint8).numpy().tobytes())


@pytest.fixture(scope="module")
def fashion_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A --data-dir whose FashionMNIST/raw holds small learnable synthetic IDX files, read
    by the real loader (so points run in any process find it)."""
    root = tmp_path_factory.mktemp("data")
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    data = synthetic_mnist(n_train=640, n_test=320)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x, y = data[split]
        write_idx(raw / f"{prefix}-images-idx3-ubyte", x)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", y)
    return root


@pytest.fixture(scope="module")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The six task folders of table-imagenet: two classes of small random images each."""
    root = tmp_path_factory.mktemp("images")
    gen = torch.Generator().manual_seed(0)
    for task in IMAGENET_TASKS:
        for c in ("a", "b"):
            (root / task / c).mkdir(parents=True)
            for i in range(15):
                img = torch.randint(0, 256, (12, 12, 3), generator=gen, dtype=torch.uint8)
                Image.fromarray(img.numpy()).save(root / task / c / f"{i}.png")
    return root


def smoke(target: str, out: Path, data: Path, images: Path | None = None, model: str | None = None):
    options = Options(scale="smoke", data_dir=data, data_root=images, model=model)
    return run_target(target, options, out, workers=1, progress=False)


def csv_rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


# ------------------------------------------------------------------------ the whole targets
@pytest.mark.slow  # every target, about 40 s
def test_every_target_at_smoke_scale_and_report_from_directories(
    fashion_dir: Path, image_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rep"
    tables = {}
    for target in ALL:
        result = smoke(target, out, fashion_dir, image_root)
        assert not result.table.incomplete, (target, [o.error for o in result.outcomes])
        for ext in ("csv", "md", "png"):
            assert (out / f"{target}.{ext}").stat().st_size > 0
        tables[target] = ((out / f"{target}.csv").read_text(), result.table.markdown())
    expected_rows = {
        "table1": 10,  # every method setting
        "fig-mnist": 8,  # 2 benchmarks x 4 methods
        "fig-pruners": 6,  # 3 pruners x 2 gammas
        "fig-alpha-gamma": 4,
        "table-imagenet": 6,  # one row per dataset
        "fig-data-efficiency": 4,  # K = 0, 1, 2 and Individual
        "fig-task-order": 3,
    }
    for target, n in expected_rows.items():
        assert len(csv_rows(out / f"{target}.csv")) == n, target
    methods = [r["method"] for r in csv_rows(out / "table1.csv")]
    assert methods == [
        "Individual-0.2",
        "Individual-1",
        "MTL",
        "PackNet",
        "SupSup",
        "CPG",
        "RMN",
        "ESPN-0.2",
        "ESPN-0.5",
        "ESPN-1",
    ]
    imagenet = {r["task"]: r for r in csv_rows(out / "table-imagenet.csv")}
    assert imagenet["imagenet"]["individual"] == "" and imagenet["imagenet"]["espn-imagenet"]
    assert imagenet["cubs"]["paper_espn-imagenet"] == "57.77"
    for path in out.glob("*.csv"):
        path.unlink()
    for result in rebuild(out):
        assert (out / f"{result.target}.csv").read_text() == tables[result.target][0]
        assert result.table.markdown() == tables[result.target][1]


def saved_figures(monkeypatch) -> list[dict]:
    """Every figure matplotlib saves from now on: its lines' x values and its title."""
    from matplotlib.figure import Figure

    seen: list[dict] = []
    save = Figure.savefig

    def record(fig, *args, **kwargs):
        xs = [list(line.get_xdata()) for ax in fig.axes for line in ax.get_lines()]
        seen.append({"lines": [x for x in xs if len(x) > 1], "title": fig.get_suptitle()})
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return seen


def test_cli_target_table_and_report_equal_the_sweeps(
    fashion_dir, fc_small_model, tmp_path, monkeypatch
):
    """The CLI's table is the runs' numbers; every output says SMOKE SCALE first (markdown
    title and first line, the figure's title, the CSV's scale column), also when ``report``
    rebuilds it; tasks are numbered from 0 in the CSV and on the figure's axis."""
    figures = saved_figures(monkeypatch)
    out = tmp_path / "rep"
    args = ["reproduce", "fig-task-order", "--scale", "smoke", "--out", str(out)]
    args += [
        "--workers",
        "1",
        "--model",
        fc_small_model,
        "--data-dir",
        str(fashion_dir),
        "--no-progress",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| ESPN-0.2 | large-first | 1 |" in result.output
    banner = "SMOKE SCALE — not a result"
    assert result.output.startswith(f"# {banner}: fig-task-order: ")
    md_lines = (out / "fig-task-order.md").read_text().splitlines()
    assert md_lines[0].startswith(f"# {banner}: fig-task-order: ")
    assert md_lines[2].startswith(f"> **{banner}**: a few dozen images")
    title = Image.open(out / "fig-task-order.png").text["Title"]
    assert title.startswith(f"{banner}: Fig. 2c")
    assert figures[-1]["lines"] == [[0, 1, 2]] * 3  # the target's figure, saved last
    rows = csv_rows(out / "fig-task-order.csv")
    assert {r["scale"] for r in rows} == {"smoke"}
    assert [k for k in rows[0] if k.startswith("task")] == ["task0", "task1", "task2"]
    assert [(r["method"], r["order"]) for r in rows] == [
        ("ESPN-0.2", "large-first"),
        ("ESPN-0.2", "small-first"),
        ("Individual-1", "given"),
    ]
    # the table's numbers are those of the runs' results.json, independently recomputed
    for r in rows:
        series = f"{'espn-0.2' if r['method'] == 'ESPN-0.2' else 'individual-1'}+{r['order']}"
        doc = json.loads(
            (out / point_name("fig-task-order", series, 0) / "results.json").read_text()
        )
        assert doc["config"]["train_sizes"] == "geometric:64:16"
        assert doc["config"]["task_order"] == r["order"]
        pairs = zip(doc["train_samples"], doc["final_accuracy"], strict=True)
        ranked = [a for _, a in sorted(pairs, key=lambda p: -p[0])]
        assert [float(r[f"task{j}"]) for j in (0, 1, 2)] == pytest.approx(ranked)
        assert float(r["avg"]) == pytest.approx(sum(ranked) / 3)
    md = (out / "fig-task-order.md").read_text()
    assert "stands in for the paper's RotatedMNIST" in md and "paper says:" in md
    # report rebuilds the very same table from the directories alone
    files = {ext: (out / f"fig-task-order.{ext}").read_text() for ext in ("csv", "md")}
    for ext in ("csv", "md", "png"):
        (out / f"fig-task-order.{ext}").unlink()
    rebuilt = runner.invoke(app, ["reproduce", "report", str(out)])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert {ext: (out / f"fig-task-order.{ext}").read_text() for ext in files} == files
    assert Image.open(out / "fig-task-order.png").text["Title"] == title
    again = runner.invoke(app, args)  # every point finished: reused, the same table
    assert again.exit_code == 0 and again.output == result.output


def test_alpha_gamma_keeps_a_run_that_ran_out_of_capacity(fashion_dir, fc_small_model, tmp_path):
    """alpha 1 at gamma 1: the first task takes every weight, the run stops before task 2;
    the table reports it from the task it learned and says so."""
    out = tmp_path / "rep"
    result = smoke("fig-alpha-gamma", out, fashion_dir, model=fc_small_model)
    rows = {
        (float(r["alpha"]), float(r["gamma"])): r for r in csv_rows(out / "fig-alpha-gamma.csv")
    }
    assert rows[1.0, 1.0]["tasks_learned"] == "1/2" and rows[0.1, 0.2]["tasks_learned"] == "2/2"
    assert not result.table.incomplete
    assert "no new weight" in (out / "fig-alpha-gamma.md").read_text()
    assert [o.status for o in result.outcomes].count("failed") == 1


# ------------------------------------------------------------------------------ the CLI
def test_list_names_every_target_and_scale() -> None:
    result = runner.invoke(app, ["reproduce", "list"])
    assert result.exit_code == 0, result.output
    for name in ALL:
        assert f"{name}:" in result.output
    assert TARGETS.names() == ALL
    assert all(f"    {s}:" in result.output for s in SCALES)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["reproduce", "table2", "--scale", "cpu"],
            "unknown target 'table2'; choose one of: table1",
        ),
        (
            ["reproduce", "table1", "--scale", "huge"],
            "unknown scale 'huge'; choose one of: smoke, cpu, paper",
        ),
        (
            ["reproduce", "table1", "--scale", "cpu", "--seeds", "0"],
            "seeds must be a count in [1, 1000]",
        ),
        (
            ["reproduce", "table-imagenet", "--scale", "smoke"],
            "needs the paper's six image datasets",
        ),
    ],
)
def test_bad_requests_are_refused_before_anything_runs(args, message, tmp_path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not out.exists() or not any(out.iterdir())


def test_imagenet_folders_missing_are_named(tmp_path: Path) -> None:
    (tmp_path / "imagenet").mkdir()
    (tmp_path / "cubs").mkdir()
    with pytest.raises(ReproduceError, match=r"lacks cars/, flowers/, wikiart/, sketch/"):
        TARGETS.get("table-imagenet").stages(Options(data_root=tmp_path), tmp_path / "out")


def test_report_of_a_directory_without_runs_is_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, ["reproduce", "report", str(tmp_path)])
    assert result.exit_code == 2 and "no run directories" in result.output


# ---------------------------------------------------------------- points, every scale
@pytest.mark.parametrize("scale", SCALES)
def test_every_point_of_every_target_is_a_valid_run(scale: str, tmp_path: Path) -> None:
    """At every scale every target's points validate (later stages start from runs of the
    first, so their options are checked without the source)."""
    for task in IMAGENET_TASKS:
        (tmp_path / "img" / task).mkdir(parents=True)
    options = Options(scale=scale, data_root=tmp_path / "img")
    for name in ALL:
        target = TARGETS.get(name)
        stages = target.stages(options, tmp_path / "out")
        names = [p.name for stage in stages for p in stage]
        assert len(names) == len(set(names)) and all(parse_name(n)[0] == name for n in names)
        for stage in stages:
            for p in stage:
                options_ = {
                    k: v for k, v in p.options.items() if k not in ("from_run", "after_task")
                }
                cfg = make_config(**options_, out=tmp_path / p.name)
                assert cfg.device == "cpu"
        seeds = {parse_name(n)[2] for n in names}
        assert seeds == set(range(target.default_seeds[scale]))
    table1 = TARGETS.get("table1").stages(options, tmp_path)[0]
    if scale == "paper":
        assert {p.options["preset"] for p in table1} == {"paper"}
        assert {p.options["task_seed"] for p in table1} == {0}  # 5 seeds on one sequence
        assert len(table1) == 50


def test_data_efficiency_second_stage_starts_from_the_first(tmp_path: Path) -> None:
    first, second = TARGETS.get("fig-data-efficiency").stages(Options(scale="cpu"), tmp_path)
    sources = {str(tmp_path.resolve() / p.name) for p in first}
    assert {p.options["after_task"] for p in second} == {1, 2, 4, 8}
    assert all(p.options["from_run"] in sources for p in second)
    src = next(p for p in first if p.name == "fig-data-efficiency__espn-0.2+source__seed0")
    assert src.options["train_sizes"] == [100, 100] + [1000] * 8
    assert src.options["task_order"] == "large-first"
    # the small tasks are the sequence's first two: the first tasks of every small-task run
    small = [p for p in first + second if "+source" not in p.name]
    assert {(p.options["tasks"], p.options["train_per_task"]) for p in small} == {(2, 100)}
    assert {p.options["batch_size"] for p in small} == {32}


# ------------------------------------------------------------------ aggregation, numbers
def test_mean_and_standard_error_match_an_independent_computation() -> None:
    values = [71.0, 73.5, 70.25, 74.0, 72.0]
    mean, se = mean_se(values)
    assert mean == pytest.approx(statistics.fmean(values))
    assert se == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)))
    assert mean_se([5.0]) == (5.0, None) and mean_se([]) == (None, None)


def _doc(method: str, gamma: float, accs: list[float], flops: float) -> dict:
    return {
        "benchmark": "split-cifar100",
        "model": "resnet18-reduced",
        "method": method,
        "gamma": gamma,
        "final_accuracy": accs,
        "average_accuracy": sum(accs) / len(accs),
        "flops_ratio": [flops] * len(accs),
        "config": {},
    }


def test_table1_aggregates_seeds_beside_the_papers_numbers() -> None:
    runs = [
        Run("table1__espn-0.2__seed0", "espn-0.2", 0, _doc("espn", 0.2, [80.0, 90.0], 0.19)),
        Run("table1__espn-0.2__seed1", "espn-0.2", 1, _doc("espn", 0.2, [84.0, 92.0], 0.2)),
        Run("table1__packnet__seed0", "packnet", 0, _doc("packnet", 1.0, [70.0, 80.0], 1.0)),
    ]
    table = TARGETS.get("table1").table(runs)
    packnet, espn = table.rows  # the paper's order
    assert espn["method"] == "ESPN-0.2" and espn["seeds"] == 2
    assert espn["avg"] == pytest.approx(86.5) and espn["avg_se"] == pytest.approx(1.5)
    assert espn["task0"] == pytest.approx(82.0) and espn["task1"] == pytest.approx(91.0)
    assert (espn["paper_avg"], espn["paper_avg_se"]) == (89.1, 0.12)
    assert packnet["avg_se"] is None and packnet["paper_avg"] == 88.3
    md = table.markdown()
    assert "| ESPN-0.2 | 2 | 86.50 ± 1.50 | 89.10 ± 0.12 |" in md
    assert "stands in" not in md  # the paper's own benchmark
    assert "Ours: ESPN-0.2 86.50 (+11.50 vs the best of them, PackNet 75.00)" in md


def test_paper_numbers_are_consistent_with_the_paper() -> None:
    """Every Table 1 row's per-task numbers average to its reported mean, to the rounding of
    the paper's one-decimal numbers (PackNet's are 88.245 against 88.3)."""
    numbers = paper_numbers()
    rows = numbers["table1"]["methods"]
    assert len(rows) == 10
    for method, row in rows.items():
        assert len(row["tasks"]) == 20, method
        assert sum(row["tasks"]) / 20 == pytest.approx(row["avg"], abs=0.06), method
    imagenet = numbers["table-imagenet"]["tasks"]
    assert list(imagenet) == IMAGENET_TASKS
    assert imagenet["flowers"] == {
        "individual": 66.06,
        "espn-no-pretrain": 85.28,
        "espn-imagenet": 88.11,
    }
    assert numbers["fig-data-efficiency"]["numbers"] == {
        "individual": 68.0,
        "espn_packnet_above": 75.0,
    }
    for target in ALL:
        assert numbers[target]["ref"]


def test_small_tasks_and_size_ranks_are_read_from_the_results() -> None:
    source = {
        "config": {},
        "train_samples": [1000, 1000, 100, 100],
        "final_accuracy": [90, 91, 70, 72],
    }
    assert small_task_accuracies(source) == (2, [70.0, 72.0])
    derived = {
        "config": {"after_task": 3},
        "train_samples": [1000] * 3 + [100, 100],
        "final_accuracy": [1, 2, 3, 60, 61],
    }
    assert small_task_accuracies(derived) == (3, [60.0, 61.0])
    # learned small first: task IDs follow the sizes, not the order learned
    assert by_size_rank({"train_samples": [16, 32, 64], "final_accuracy": [50, 60, 70]}) == [
        70.0,
        60.0,
        50.0,
    ]


def test_a_reproduce_target_is_learned_by_the_one_learner(
    fashion_dir, fc_small_model, tmp_path, monkeypatch
):
    """Every point of a target goes through ``ContinualLearner.learn_sequence`` and every
    task is trained for that learner, as the points' results.json name them."""
    from helpers.learner_spy import LearnerSpy

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spy = LearnerSpy(monkeypatch)
    smoke("fig-task-order", tmp_path / "rep", fashion_dir, model=fc_small_model)
    docs = [json.loads(p.read_text()) for p in sorted((tmp_path / "rep").glob("*/results.json"))]
    assert len(docs) == 3  # ESPN-0.2 large-first and small-first, Individual-1
    assert sorted(spy.sequences) == sorted(d["task_names"] for d in docs)
    trained = sorted(name for name, _ in spy.trained)
    assert trained == sorted(n for d in docs for n in d["task_names"]) and spy.trained_by_learner
