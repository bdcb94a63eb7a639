"""The continual-representation-learning result on task order: tasks whose sample sizes fall,
learned large first, small first and individually (Fig. 2c)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from espn.reproduce.common import (
    SMOKE,
    by_series,
    figure_title,
    label,
    line_axes,
    mean_of,
    method_options,
    ordered,
    save_figure,
    signed,
)
from espn.reproduce.paper import claims_notes, data_notes
from espn.reproduce.table import Table
from espn.reproduce.target import TARGETS, Options, Run, Target
from espn.utils.plotting import pyplot
from espn.utils.stats import mean_se

if TYPE_CHECKING:
    from espn.sweep import Point

ORDER = {
    "paper": {
        "preset": "paper",
        "tasks": 20,
        "train_sizes": "geometric:2500:125",
        "step_floor": False,  # as in fig-data-efficiency: epochs as given, as the paper
    },
    "cpu": {
        "benchmark": "rotated-fashion-mnist",
        "step_floor": False,
        "tasks": 10,
        "train_sizes": "geometric:2000:100",
        "test_per_task": 1000,
    },
    "smoke": {"benchmark": "rotated-fashion-mnist", "tasks": 3}
    | SMOKE
    | {"train_sizes": "geometric:64:16"},
}
ORDER_METHODS = {
    "paper": ["espn-0.2", "espn-1", "packnet"],
    "cpu": ["espn-0.2", "packnet"],
    "smoke": ["espn-0.2"],
}
POLICIES = ["large-first", "small-first"]


def order_stages(options: Options, out: Path) -> list[list[Point]]:
    """Per method: tasks whose sizes fall geometrically, learned large first and small
    first; Individual-1 (order does not matter to it)."""
    base = ORDER[options.scale] | {"task_seed": 0}
    points = []
    for seed in FIG_TASK_ORDER.seeds(options):
        for m in ORDER_METHODS[options.scale]:
            for policy in POLICIES:
                run = method_options(m) | {"task_order": policy}
                points.append(FIG_TASK_ORDER.point(options, f"{m}+{policy}", seed, base | run))
        alone = method_options("individual-1")
        points.append(FIG_TASK_ORDER.point(options, "individual-1+given", seed, base | alone))
    return [points]


def by_size_rank(doc: dict[str, Any]) -> list[float]:
    """Final accuracies by task ID = rank of the training-set size (1 = the largest task),
    whatever order the tasks were learned in (ties: in the order learned)."""
    sizes, accs = doc["train_samples"], doc["final_accuracy"]
    rank = sorted(range(len(sizes)), key=lambda j: (-sizes[j], j))
    return [float(accs[j]) for j in rank]


def order_table(runs: list[Run]) -> Table:
    """Per method and order: task-averaged accuracy, the larger and the smaller half of the
    tasks (by size), and each task's accuracy by task ID (mean over seeds)."""
    groups = by_series(runs)
    n = max((len(r.doc["final_accuracy"]) for r in runs), default=0)
    tasks = [f"task{j}" for j in range(n)]
    columns = ["method", "order", "seeds", "avg", "avg_se", "large_half", "large_half_se"]
    columns += ["small_half", "small_half_se", *tasks]
    series_order = [f"{m}+{p}" for m in ORDER_METHODS["paper"] for p in POLICIES]
    rows = []
    for s in ordered(groups, [*series_order, "individual-1+given"]):
        rs = groups[s]
        method, _, policy = s.partition("+")
        accs = [by_size_rank(r.doc) for r in rs]
        half = n // 2
        row: dict[str, Any] = {"method": label(method), "order": policy, "seeds": len(rs)}
        row["avg"], row["avg_se"] = mean_se([mean_of(a) for a in accs])
        row["large_half"], row["large_half_se"] = mean_se([mean_of(a[:half] or a) for a in accs])
        row["small_half"], row["small_half_se"] = mean_se([mean_of(a[half:]) for a in accs])
        for j, name in enumerate(tasks):
            row[name] = mean_of([a[j] for a in accs if j < len(a)])
        rows.append(row)
    table = Table("fig-task-order", FIG_TASK_ORDER.title, columns, rows)
    table.md_columns = columns[:9]
    sizes = sorted({s for r in runs for s in r.doc["train_samples"]}, reverse=True)
    notes = data_notes(runs)
    notes.append(
        "task ID = rank of the training-set size, from 0 (0: the largest, "
        f"{sizes[0] if sizes else '-'} images; last: {sizes[-1] if sizes else '-'}); "
        "large_half / small_half: mean over the larger / smaller half of the tasks"
    )
    table.notes = notes + claims_notes("fig-task-order", _order_observations(table))
    return table


def _order_observations(table: Table) -> list[str]:
    row = {(r["method"], r["order"]): r for r in table.rows}
    first, second = [], []
    ind = row.get(("Individual-1", "given"))
    for method in dict.fromkeys(r["method"] for r in table.rows if r["order"] != "given"):
        large, small = row.get((method, "large-first")), row.get((method, "small-first"))

        if large and small:
            first.append(
                f"{method} large-first {large['avg']:.2f} vs small-first {small['avg']:.2f}"
            )
        if large and small and ind:
            second.append(
                f"{method}: small half large-first {signed(large['small_half'] - ind['small_half'])} "
                f"vs Individual; large half small-first {signed(small['large_half'] - ind['large_half'])}"
            )
    return ["; ".join(first) or "needs the runs", "; ".join(second) or "needs the runs"]


def order_plot(table: Table, path: Path) -> None:
    """Accuracy by task ID (size rank): solid large-first, dashed small-first, dotted
    Individual (the paper smooths its curves with a moving average; we do not)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {"large-first": "-", "small-first": "--", "given": ":"}
    colours = {"ESPN-0.2": "tab:blue", "ESPN-1": "tab:green", "PackNet": "tab:orange"}
    for r in table.rows:
        ys = [v for k, v in r.items() if k.startswith("task") and v is not None]
        ax.plot(
            range(len(ys)),
            ys,
            ls=styles.get(r["order"], "-"),
            marker=".",
            color=colours.get(r["method"], "tab:red"),
            label=f"{r['method']} {r['order']}",
        )
    line_axes(ax, "task ID, from 0 (larger ID has less data)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(figure_title("Fig. 2c (curves only in the paper)", table), fontsize=9)
    save_figure(fig, path)


FIG_TASK_ORDER = Target(
    name="fig-task-order",
    title="Task order by sample size: large tasks first vs small first vs Individual (Fig. 2c)",
    default_seeds={"smoke": 1, "cpu": 2, "paper": 1},
    stages=order_stages,
    table=order_table,
    plot=order_plot,
    cost={
        "smoke": "3 runs of 3 tasks x 16-64 images, seconds each",
        "cpu": "10 runs (2 methods x 2 orders + Individual, 2 seeds) of 10 rotated Fashion-MNIST tasks of 2000 -> 100 images",
        "paper": "7 SplitCIFAR100 runs of 20 tasks of 2500 -> 125 images x 250 epochs on a GPU",
    },
)

TARGETS.register(FIG_TASK_ORDER.name)(FIG_TASK_ORDER)
