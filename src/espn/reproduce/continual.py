"""The continual-learning results: Table 1 (SplitCIFAR100, every method) and Fig. 4 (Rotated
and Permuted MNIST over 36 tasks)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from espn.reproduce.common import (
    CIFAR_REGIME,
    FC_RECIPE,
    METHOD_SETTINGS,
    SMOKE,
    by_series,
    figure_title,
    known,
    label,
    legend_outside_with_grid,
    line_axes,
    mean_of,
    method_options,
    ordered,
    planned_steps,
    save_figure,
    signed,
    steps_note,
)
from espn.reproduce.paper import claims_notes, data_notes, paper_numbers
from espn.reproduce.table import Table, markdown_table
from espn.reproduce.target import TARGETS, Options, Run, Target
from espn.utils.plotting import pyplot
from espn.utils.stats import mean_se

if TYPE_CHECKING:
    from espn.sweep import Point

# ---------------------------------------------------------------------------------- table1
#: Table 1 has every method setting
TABLE1_SERIES = list(METHOD_SETTINGS)
#: the split Fashion-MNIST stand-in of SplitCIFAR100 in the CIFAR regime (2 tasks of 2
#: classes x 2500 images, 5000 optimizer steps each as the paper's: about an hour for
#: table1's 10 runs on 2 cores, see docs/recipes.md), and at smoke scale
SPLIT_CPU = CIFAR_REGIME | {"tasks": 2, "test_per_task": 1000}
SPLIT_SMOKE = {"benchmark": "split-fashion-mnist", **FC_RECIPE, **SMOKE, "tasks": 2}
#: training images of a task of the paper's SplitCIFAR100 and (Rotated/Permuted) MNIST
CIFAR_TASK_SIZE, MNIST_TASK_SIZE = 2500, 60000


def split_base(options: Options) -> dict[str, Any]:
    """SplitCIFAR100 with the paper's recipe, or its split Fashion-MNIST stand-in (FC1024,
    tasks of 2 classes), always on one task sequence (task seed 0) as the paper."""
    if options.scale == "paper":
        return {"preset": "paper", "task_seed": 0}
    return (SPLIT_CPU if options.scale == "cpu" else SPLIT_SMOKE) | {"task_seed": 0}


def split_paper_steps(series: str) -> list[tuple[str, int]]:
    """Optimizer steps per phase of a task of the paper's SplitCIFAR100 run of ``series``
    (MTL: its one joint task of all 20 tasks' images)."""
    size = CIFAR_TASK_SIZE * (20 if series == "mtl" else 1)
    return planned_steps(split_base(Options(scale="paper")) | method_options(series), size)


def table1_stages(options: Options, out: Path) -> list[list[Point]]:
    """One point per method setting and seed, all on one task sequence."""
    base = split_base(options)
    # alpha 0.1 as the paper's SplitCIFAR100 runs (the ``paper`` preset sets it itself)
    alpha = None if options.scale == "paper" else 0.1
    return [
        [
            TABLE1.point(options, s, seed, base | method_options(s, alpha, options.scale))
            for s in TABLE1_SERIES
            for seed in TABLE1.seeds(options)
        ]
    ]


def table1_table(runs: list[Run]) -> Table:
    """Per method: seeds, task-averaged accuracy (mean ± se over seeds) beside the paper's,
    mean FLOPs ratio, and the mean accuracy of every task."""
    groups = by_series(runs)
    reported = paper_numbers()["table1"]["methods"]
    n_tasks = max((len(r.doc["final_accuracy"]) for r in runs), default=0)
    tasks = [f"task{j}" for j in range(n_tasks)]
    columns = ["method", "seeds", "avg", "avg_se", "paper_avg", "paper_avg_se", "flops_ratio"]
    rows = []
    for s in ordered(groups, TABLE1_SERIES):
        rs = groups[s]
        avg, se = mean_se([float(r.doc["average_accuracy"]) for r in rs])
        ref = reported.get(label(s), {})
        row: dict[str, Any] = {
            "method": label(s),
            "seeds": len(rs),
            "avg": avg,
            "avg_se": se,
            "paper_avg": ref.get("avg"),
            "paper_avg_se": ref.get("se"),
            "flops_ratio": mean_of([mean_of(r.doc["flops_ratio"]) for r in rs]),
        }
        accs = [r.doc["final_accuracy"] for r in rs]
        for j, name in enumerate(tasks):
            found = [float(a[j]) for a in accs if j < len(a)]
            row[name] = mean_of(found) if found else None
        rows.append(row)
    table = Table("table1", TABLE1.title, columns + tasks, rows)
    notes = data_notes(runs, "resnet18-reduced")
    notes.append(steps_note(runs, split_paper_steps))
    table.notes = notes + claims_notes("table1", _table1_observations(table))
    table.appendix = (
        "The paper's Table 1 (SplitCIFAR100), per task (numbered from 0, as everywhere in "
        "espn):\n\n"
    ) + markdown_table(
        ["method", *[str(j) for j in range(20)], "avg ± se"],
        [[m, *v["tasks"], f"{v['avg']:.1f} ± {v['se']:.2f}"] for m, v in reported.items()],
    )
    return table


def _avg(table: Table, method: str) -> float | None:
    found = table.column("avg", method=method)
    return found[0] if found else None


def _table1_observations(table: Table) -> list[str]:
    espn = {m: _avg(table, m) for m in ("ESPN-0.2", "ESPN-0.5")}
    rivals = {m: v for m in ("PackNet", "CPG", "RMN") if (v := _avg(table, m)) is not None}
    first = "needs ESPN and PackNet/CPG/RMN runs"
    if rivals and any(v is not None for v in espn.values()):
        best = max(rivals, key=lambda m: rivals[m])
        first = ", ".join(
            f"{m} {v:.2f} ({signed(v - rivals[best])} vs the best of them, {best} {rivals[best]:.2f})"
            for m, v in espn.items()
            if v is not None
        )
    ind = known(_avg(table, "Individual-0.2"), _avg(table, "Individual-1"))
    second = (
        f"Individual-0.2 {ind[0]:.2f} vs Individual-1 {ind[1]:.2f} ({signed(ind[0] - ind[1])})"
        if ind
        else "needs both Individual runs"
    )
    ranked = sorted(table.rows, key=lambda r: -(r["avg"] or 0.0))
    third = (
        "MTL ranks "
        + str(next(i + 1 for i, r in enumerate(ranked) if r["method"] == "MTL"))
        + f" of {len(ranked)} (best: {ranked[0]['method']} {ranked[0]['avg']:.2f})"
        if any(r["method"] == "MTL" for r in ranked)
        else "needs an MTL run"
    )
    return [first, second, third]


def table1_plot(table: Table, path: Path) -> None:
    """Bars: our task-averaged accuracy ± se per method, the paper's as markers."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.2))
    xs = range(len(table.rows))
    ours = [r["avg"] for r in table.rows]
    errs = [r["avg_se"] or 0.0 for r in table.rows]
    ax.bar(xs, ours, yerr=errs, color="tab:blue", alpha=0.8, capsize=3, label="ours")
    px = [i for i, r in enumerate(table.rows) if r["paper_avg"] is not None]
    ax.scatter(
        px,
        [table.rows[i]["paper_avg"] for i in px],
        color="tab:red",
        marker="D",
        zorder=3,
        label="paper (Table 1, SplitCIFAR100)",
    )
    ax.set_xticks(list(xs), [r["method"] for r in table.rows], rotation=30, ha="right")
    low = min([v for v in ours if v is not None] + [77.0])
    ax.set_ylim(max(0.0, low - 5), 100)
    ax.set_ylabel("task-averaged test accuracy (%)")
    ax.set_title(figure_title("Table 1", table))
    legend_outside_with_grid(ax)
    save_figure(fig, path)


TABLE1 = Target(
    name="table1",
    title="SplitCIFAR100, every method: accuracy per task and task-averaged (Table 1)",
    default_seeds={"smoke": 1, "cpu": 1, "paper": 5},
    stages=table1_stages,
    table=table1_table,
    plot=table1_plot,
    cost={
        "smoke": "10 runs of 2 tasks x 64 images, seconds each",
        "cpu": "10 runs (10 methods x 1 seed) of 2 split Fashion-MNIST tasks x 2500 images "
        "on FC1024 at the paper's 5000 optimizer steps per task (CIFAR regime); see "
        "docs/recipes.md for the measured cost",
        "paper": "50 runs (10 methods x 5 seeds) of 20 SplitCIFAR100 tasks x 250 epochs on a GPU",
    },
)

# -------------------------------------------------------------------------------- fig-mnist
MNIST_METHODS = ["espn-0.2", "packnet", "individual-0.2", "individual-1"]
MNIST_KINDS = ["rotated", "permuted"]


def mnist_base(kind: str, options: Options) -> dict[str, Any]:
    """Rotated/Permuted MNIST with the paper's FC1024 recipe (36 tasks), or the Fashion-MNIST
    variants with fewer tasks and images."""
    if options.scale == "paper":
        return {"benchmark": f"{kind}-mnist"}
    if options.scale == "cpu":  # full 60000-image tasks: the paper's 2350 steps per task
        return {"benchmark": f"{kind}-fashion-mnist", "tasks": 10, "test_per_task": 1000}
    return {"benchmark": f"{kind}-fashion-mnist", "tasks": 2} | SMOKE


def mnist_paper_steps(series: str) -> list[tuple[str, int]]:
    """Optimizer steps per phase of a task of the paper's Rotated/Permuted MNIST run of
    ``series`` (``kind+method``)."""
    kind, _, method = series.partition("+")
    paper_point = mnist_base(kind, Options(scale="paper")) | method_options(method)
    return planned_steps(paper_point, MNIST_TASK_SIZE)


def mnist_stages(options: Options, out: Path) -> list[list[Point]]:
    """One point per benchmark, method and seed (the seed also draws the task sequence)."""
    return [
        [
            FIG_MNIST.point(
                options,
                f"{kind}+{s}",
                seed,
                mnist_base(kind, options) | method_options(s, scale=options.scale),
            )
            for kind in MNIST_KINDS
            for s in MNIST_METHODS
            for seed in FIG_MNIST.seeds(options)
        ]
    ]


def mnist_table(runs: list[Run]) -> Table:
    """Per benchmark and method: task-averaged accuracy, the first quarter of the tasks, the
    second half, and every task's final accuracy (mean over seeds)."""
    groups = by_series(runs)
    n_tasks = max((len(r.doc["final_accuracy"]) for r in runs), default=0)
    tasks = [f"task{j}" for j in range(n_tasks)]
    columns = ["benchmark", "method", "seeds", "avg", "avg_se", "early", "early_se"]
    columns += ["late", "late_se", *tasks]
    order = [f"{k}+{m}" for k in MNIST_KINDS for m in MNIST_METHODS]
    rows = []
    for s in ordered(groups, order):
        rs = groups[s]
        _, _, method = s.partition("+")
        row: dict[str, Any] = {"benchmark": rs[0].doc["benchmark"], "method": label(method)}
        row["seeds"] = len(rs)
        row["avg"], row["avg_se"] = mean_se([float(r.doc["average_accuracy"]) for r in rs])
        accs = [[float(a) for a in r.doc["final_accuracy"]] for r in rs]
        row["early"], row["early_se"] = mean_se(
            [mean_of(a[: max(1, math.ceil(len(a) / 4))]) for a in accs]
        )
        row["late"], row["late_se"] = mean_se([mean_of(a[len(a) // 2 :]) for a in accs])
        for j, name in enumerate(tasks):
            found = [a[j] for a in accs if j < len(a)]
            row[name] = mean_of(found) if found else None
        rows.append(row)
    table = Table("fig-mnist", FIG_MNIST.title, columns, rows)
    table.md_columns = columns[:9]
    notes = data_notes(runs, "fc1024")
    notes.append(
        "early: mean final accuracy of the first quarter of the tasks; late: of the second "
        "half (by zero forgetting, a task's final accuracy is its accuracy when learned)"
    )
    notes.append(steps_note(runs, mnist_paper_steps))
    table.notes = notes + claims_notes("fig-mnist", _mnist_observations(table))
    return table


def _get(table: Table, column: str, benchmark_kind: str, method: str) -> float | None:
    for r in table.rows:
        if r["benchmark"].startswith(benchmark_kind) and r["method"] == method:
            return r[column]
    return None


def _mnist_observations(table: Table) -> list[str]:
    first, second, third = [], [], []
    for kind in MNIST_KINDS:
        ind = known(*(_get(table, "avg", kind, m) for m in ("Individual-0.2", "Individual-1")))
        if ind:
            a, b = ind
            first.append(
                f"{kind}: Individual-0.2 {a:.2f} vs Individual-1 {b:.2f} ({signed(a - b)})"
            )
        e = known(*(_get(table, c, kind, "ESPN-0.2") for c in ("early", "late")))
        p = known(*(_get(table, c, kind, "PackNet") for c in ("early", "late")))
        if e and p:
            second.append(
                f"{kind}: ESPN-0.2 minus PackNet {signed(e[0] - p[0])} on the early tasks, "
                f"{signed(e[1] - p[1])} on the late ones"
            )
    late = known(*(_get(table, "late", k, "ESPN-0.2") for k in MNIST_KINDS))
    early = known(*(_get(table, "early", k, "ESPN-0.2") for k in MNIST_KINDS))
    if late and early:
        third.append(
            f"ESPN-0.2 from early to late tasks: rotated {signed(late[0] - early[0])}, "
            f"permuted {signed(late[1] - early[1])}; late tasks rotated minus permuted "
            f"{signed(late[0] - late[1])}"
        )
    return ["; ".join(x) or "needs the runs" for x in (first, second, third)]


def mnist_plot(table: Table, path: Path) -> None:
    """Per benchmark: final accuracy per task id for ESPN-0.2 and PackNet, Individual-0.2/-1
    as dashed lines at their task-averaged accuracy (the paper's Fig. 4 gives no numbers)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colours = {"ESPN-0.2": "tab:blue", "PackNet": "tab:orange"}
    lines = {"Individual-0.2": "tab:green", "Individual-1": "tab:red"}
    for ax, kind in zip(axes, MNIST_KINDS, strict=True):
        mine = [r for r in table.rows if r["benchmark"].startswith(kind)]
        for r in mine:
            ys = [v for k, v in r.items() if k.startswith("task") and v is not None]
            if r["method"] in colours:
                ax.plot(
                    range(len(ys)),
                    ys,
                    marker=".",
                    color=colours[r["method"]],
                    label=r["method"],
                )
            elif r["method"] in lines:
                ax.axhline(r["avg"], ls="--", color=lines[r["method"]], label=r["method"])
        ax.set_title(f"{mine[0]['benchmark'] if mine else kind}")
        line_axes(ax, "task (numbered from 0)", legend_size=8)
    axes[0].set_ylabel("test accuracy (%)")
    fig.suptitle(figure_title("Fig. 4 (the paper gives curves only)", table))
    save_figure(fig, path)


FIG_MNIST = Target(
    name="fig-mnist",
    title="Rotated and Permuted MNIST: ESPN-0.2 and PackNet per task, Individual-0.2/-1 (Fig. 4)",
    default_seeds={"smoke": 1, "cpu": 1, "paper": 5},
    stages=mnist_stages,
    table=mnist_table,
    plot=mnist_plot,
    cost={
        "smoke": "8 runs of 2 tasks x 64 images, seconds each",
        "cpu": "8 runs (2 benchmarks x 4 methods x 1 seed) of 10 Fashion-MNIST tasks x 60000 "
        "images at the paper's 2350 optimizer steps per task; see docs/recipes.md for "
        "the measured cost",
        "paper": "40 runs (2 x 4 x 5 seeds) of 36 MNIST tasks x 60000 images x 10 epochs",
    },
)

for _target in (TABLE1, FIG_MNIST):
    TARGETS.register(_target.name)(_target)
