"""The continual-representation-learning results: task diversity (the ImageNet table, Fig.
2b) and data efficiency of small tasks learned late (Fig. 2a); task order by sample size (Fig.
2c) is :mod:`espn.reproduce.task_order`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from espn.reproduce.common import (
    SMOKE,
    by_series,
    error_line,
    figure_title,
    label,
    legend_outside_with_grid,
    line_axes,
    mean_of,
    method_options,
    ordered,
    save_figure,
    signed,
)
from espn.reproduce.paper import claims_notes, data_notes, paper_numbers
from espn.reproduce.table import Table
from espn.reproduce.target import TARGETS, Options, ReproduceError, Run, Target
from espn.settings.recipes import IMAGENET
from espn.utils.plotting import pyplot
from espn.utils.stats import mean_se

if TYPE_CHECKING:
    from espn.sweep import Point

# --------------------------------------------------------------------------- table-imagenet
IMAGENET_TASKS = ["imagenet", "cubs", "cars", "flowers", "wikiart", "sketch"]
IMAGENET_SERIES = ["individual", "espn-no-pretrain", "espn-imagenet"]


def imagenet_folders(options: Options) -> list[Path]:
    """The six task folders under ``options.data_root``, refused clearly when missing."""
    layout = ", ".join(f"{t}/" for t in IMAGENET_TASKS)
    if options.data_root is None:
        raise ReproduceError(
            "table-imagenet needs the paper's six image datasets: give --data-root DIR where "
            f"DIR holds {layout} (each an ImageFolder directory: train/ and val/, or the class "
            "directories); they cannot be downloaded by espn"
        )
    root = Path(options.data_root)
    missing = [t for t in IMAGENET_TASKS if not (root / t).is_dir()]
    if missing:
        raise ReproduceError(
            f"table-imagenet: --data-root {root} lacks {', '.join(f'{t}/' for t in missing)}; "
            f"it must hold {layout} (ImageFolder directories)"
        )
    return [root / t for t in IMAGENET_TASKS]


def imagenet_base(options: Options) -> dict[str, Any]:
    """The appendix's recipe (``imagenet`` preset: ResNet50 at 224 px), or a reduced ResNet18
    on small images and subsets for the CPU."""
    if options.scale == "paper":
        return {"preset": "imagenet"}
    small = {"benchmark": "image-folders", "model": "resnet18-reduced"}
    if options.scale == "cpu":
        return small | {
            "image_size": 64,
            "train_per_task": 1000,
            "test_per_task": 500,
            "epochs": [2, 3, 2],
            "batch_size": 64,
        }
    return small | SMOKE | {"image_size": 16, "train_per_task": 16, "test_per_task": 8}


def imagenet_stages(options: Options, out: Path) -> list[list[Point]]:
    """Individual and ESPN on CUBS..Sketch, and ESPN with ImageNet first (learned from the
    folder, or adopted from ``--init-weights`` as the paper's sparse pretrained ResNet50)."""
    folders = [str(f) for f in imagenet_folders(options)]
    base = imagenet_base(options) | {"alpha": IMAGENET["alpha"]}
    espn = {"method": "espn", "gamma": 0.2}
    settings = {
        "individual": {"method": "individual", "gamma": 1.0, "folders": folders[1:]},
        "espn-no-pretrain": espn | {"folders": folders[1:]},
        "espn-imagenet": espn | {"folders": folders},
    }
    if options.init_weights is not None:
        settings["espn-imagenet"]["init_weights"] = str(options.init_weights)
    return [
        [
            TABLE_IMAGENET.point(options, s, seed, base | settings[s])
            for s in IMAGENET_SERIES
            for seed in TABLE_IMAGENET.seeds(options)
        ]
    ]


def _by_task(run: Run) -> dict[str, float]:
    """Final accuracy per task, by folder name."""
    names = [Path(n).name.lower() for n in run.doc["task_names"]]
    return {n: float(a) for n, a in zip(names, run.doc["final_accuracy"], strict=False)}


def imagenet_table(runs: list[Run]) -> Table:
    """Per dataset: final accuracy of each of the three settings beside the paper's."""
    groups = by_series(runs)
    reported = paper_numbers()["table-imagenet"]["tasks"]
    columns = ["task"]
    for s in IMAGENET_SERIES:
        columns += [s, f"{s}_se", f"paper_{s}"]
    seen = {n for r in runs for n in _by_task(r)}
    rows = []
    for task in ordered(seen | set(IMAGENET_TASKS), IMAGENET_TASKS):
        row: dict[str, Any] = {"task": task}
        for s in IMAGENET_SERIES:
            found = [_by_task(r)[task] for r in groups.get(s, []) if task in _by_task(r)]
            row[s], row[f"{s}_se"] = mean_se(found)
            row[f"paper_{s}"] = reported.get(task, {}).get(s)
        rows.append(row)
    table = Table("table-imagenet", TABLE_IMAGENET.title, columns, rows)
    models = ", ".join(sorted({r.doc["model"] for r in runs} - {"resnet50"}))
    notes = [f"model: {models} at reduced image size and subsets (CPU cost)"] if models else []
    pretrained = [r for r in groups.get("espn-imagenet", []) if r.doc["config"].get("init_weights")]
    notes.append(
        "ImageNet first: adopted from --init-weights (as the paper's sparse pretrained ResNet50)"
        if pretrained
        else "ImageNet first: learned from the imagenet folder as task 1 (no --init-weights given)"
    )
    table.notes = notes + claims_notes("table-imagenet", _imagenet_observations(table))
    return table


def _imagenet_observations(table: Table) -> list[str]:
    later = [r for r in table.rows if r["task"] != "imagenet"]
    pairs = [
        (r["espn-imagenet"], r["espn-no-pretrain"], r["individual"])
        for r in later
        if None not in (r["espn-imagenet"], r["espn-no-pretrain"], r["individual"])
    ]
    if not pairs:
        return ["needs the three settings' runs"]
    better = sum(a > b and a > c for a, b, c in pairs)
    gain = mean_of([a - b for a, b, _ in pairs])
    return [
        f"ImageNet first beats both others on {better} of {len(pairs)} tasks "
        f"(mean {signed(gain)} points over no pretrain)"
    ]


def imagenet_plot(table: Table, path: Path) -> None:
    """Grouped bars per dataset (ours), the paper's numbers as markers."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = range(len(table.rows))
    colours = dict(zip(IMAGENET_SERIES, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    for i, s in enumerate(IMAGENET_SERIES):
        at = [x + (i - 1) * 0.27 for x in xs]
        ys = [math.nan if r[s] is None else r[s] for r in table.rows]
        es = [r[f"{s}_se"] or 0.0 for r in table.rows]
        ax.bar(at, ys, 0.27, yerr=es, color=colours[s], label=f"ours: {s}")
        ps = [math.nan if r[f"paper_{s}"] is None else r[f"paper_{s}"] for r in table.rows]
        ax.scatter(at, ps, color="black", marker="_", s=200, zorder=3)
    ax.scatter([], [], color="black", marker="_", s=200, label="paper (appendix table)")
    ax.set_xticks(list(xs), [r["task"] for r in table.rows])
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(
        figure_title("ImageNet -> CUBS -> Cars -> Flowers -> WikiArt -> Sketch (Fig. 2b)", table)
    )
    legend_outside_with_grid(ax)
    save_figure(fig, path)


TABLE_IMAGENET = Target(
    name="table-imagenet",
    title="Task diversity: CUBS..Sketch with and without ImageNet first (appendix table, Fig. 2b)",
    default_seeds={"smoke": 1, "cpu": 1, "paper": 1},
    stages=imagenet_stages,
    table=imagenet_table,
    plot=imagenet_plot,
    cost={
        "smoke": "3 runs on tiny image folders, seconds each (needs --data-root)",
        "cpu": "3 runs of 5-6 tasks x 1000 images at 64 px on a reduced ResNet18 (needs --data-root)",
        "paper": "3 ResNet50 runs at 224 px x 250 epochs per task, ImageNet included, on a GPU (needs --data-root)",
    },
)


# ---------------------------------------------------------------------- fig-data-efficiency
@dataclass(frozen=True)
class Efficiency:
    """The data-efficiency experiment at one scale: ``small_tasks`` of ``small`` images learned
    on the supernets after each K in ``before`` of ``full_tasks`` tasks of ``full`` images;
    ``small_recipe``: options of every run that learns the small tasks."""

    base: dict[str, Any]
    full_tasks: int
    small_tasks: int
    full: int
    small: int
    before: tuple[int, ...]
    small_recipe: dict[str, Any] = field(default_factory=dict)


EFFICIENCY = {
    # the paper trains every task for the recipe's epochs whatever its size (a small task
    # gets fewer steps): the size rule is off in both data-size targets, at every scale
    "paper": Efficiency(
        {"preset": "paper", "step_floor": False}, 15, 5, 2500, 250, tuple(range(16))
    ),
    # with the MNIST recipe (batch 256, 10 epochs) a task of 100 images would get 10 steps
    # (the paper's small tasks get 500): the small-task runs take batch 32 and 30 epochs
    "cpu": Efficiency(
        {"benchmark": "rotated-fashion-mnist", "test_per_task": 1000, "step_floor": False},
        8,
        2,
        1000,
        100,
        (0, 1, 2, 4, 8),
        {"batch_size": 32, "epochs": [9, 12, 9]},
    ),
    "smoke": Efficiency({"benchmark": "rotated-fashion-mnist"} | SMOKE, 2, 1, 64, 16, (0, 1, 2)),
}
EFFICIENCY_METHODS = {
    "paper": ["espn-0.2", "espn-1", "packnet"],
    "cpu": ["espn-0.2", "espn-1", "packnet"],
    "smoke": ["espn-0.2"],
}


def efficiency_stages(options: Options, out: Path) -> list[list[Point]]:
    """Stage 1: per method a source run learning the full-data tasks first (``large-first``
    on a sequence whose first tasks are the small ones, learned last); the small tasks on a
    fresh supernet (K = 0); Individual. Stage 2: the small tasks on each source's supernet
    after K full tasks (``from_run``)."""

    e = EFFICIENCY[options.scale]
    n_full, ks = e.full_tasks, e.before
    base = e.base | {"task_seed": 0}
    small_only = {"tasks": e.small_tasks, "train_per_task": e.small} | e.small_recipe
    sizes = [e.small] * e.small_tasks + [e.full] * n_full
    source = {"tasks": e.small_tasks + n_full, "train_sizes": sizes, "task_order": "large-first"}
    first: list[Point] = []
    second: list[Point] = []
    for seed in FIG_DATA_EFFICIENCY.seeds(options):
        for m in EFFICIENCY_METHODS[options.scale]:
            method = method_options(m)
            src = FIG_DATA_EFFICIENCY.point(options, f"{m}+source", seed, base | method | source)
            small = base | method | small_only
            first.append(src)
            if 0 in ks:
                first.append(FIG_DATA_EFFICIENCY.point(options, f"{m}+k0", seed, small))
            for k in (k for k in ks if 0 < k <= n_full):
                after = {"from_run": str(Path(out).resolve() / src.name), "after_task": k}
                second.append(FIG_DATA_EFFICIENCY.point(options, f"{m}+k{k}", seed, small | after))
        alone = method_options("individual-1") | small_only
        first.append(FIG_DATA_EFFICIENCY.point(options, "individual-1+alone", seed, base | alone))
    return [first, second]


def small_task_accuracies(doc: dict[str, Any]) -> tuple[int, list[float]]:
    """(tasks learned before the small ones, the small tasks' final accuracies) of a run:
    its own tasks are those after the ``after_task`` inherited ones, the small ones those
    of its own tasks with the fewest training images."""
    inherited = int(doc["config"].get("after_task") or 0)
    sizes = doc["train_samples"][inherited:]
    accs = [float(a) for a in doc["final_accuracy"][inherited:]]
    least = min(sizes)
    before = inherited + sum(s > least for s in sizes)
    return before, [a for a, s in zip(accs, sizes, strict=True) if s == least]


def efficiency_table(runs: list[Run]) -> Table:
    """Per method and K (full-data tasks learned before): accuracy of the small tasks (mean
    over them, then mean ± se over seeds) and of the first small task; Individual alone."""
    groups: dict[tuple[str, int | None], list[tuple[float, float]]] = {}
    small_sizes, recipes = set(), set()
    for r in runs:
        method, _, role = r.series.partition("+")
        if role == "source":  # the supernets' run: its small tasks are not a point
            continue
        cfg = r.doc["config"]
        recipes.add(f"batch {cfg['batch_size']}, epochs {','.join(map(str, cfg['epochs']))}")
        before, accs = small_task_accuracies(r.doc)
        small_sizes.add(min(r.doc["train_samples"][int(r.doc["config"].get("after_task") or 0) :]))
        key = (method, None if method.startswith("individual") else before)
        groups.setdefault(key, []).append((mean_of(accs), accs[0]))
    order = ["espn-0.2", "espn-1", "packnet", "individual-1"]
    columns = ["method", "tasks_before", "seeds", "small", "small_se", "first", "first_se"]
    rows = []
    for method in ordered({m for m, _ in groups}, order):
        for k in sorted(
            {k for m, k in groups if m == method}, key=lambda k: -1 if k is None else k
        ):
            vals = groups[method, k]
            row: dict[str, Any] = {"method": label(method), "tasks_before": k, "seeds": len(vals)}
            row["small"], row["small_se"] = mean_se([v for v, _ in vals])
            row["first"], row["first_se"] = mean_se([f for _, f in vals])
            rows.append(row)
    table = Table("fig-data-efficiency", FIG_DATA_EFFICIENCY.title, columns, rows)
    notes = data_notes(runs)
    notes.append(
        f"small tasks: {', '.join(map(str, sorted(small_sizes)))} training images each; "
        "small: mean over the small tasks, learned one after the other on the supernet after "
        "tasks_before full-data tasks (the paper trains each on it separately); first: the "
        "first small task, learned directly on that supernet; the small-task runs: "
        + "; ".join(sorted(recipes))
    )
    table.notes = notes + claims_notes("fig-data-efficiency", _efficiency_observations(table))
    return table


def _efficiency_observations(table: Table) -> list[str]:
    ind = [r["small"] for r in table.rows if r["tasks_before"] is None]
    cl = [r for r in table.rows if r["tasks_before"] is not None]
    if not ind or not cl:
        return ["needs the runs"]
    most = max(r["tasks_before"] for r in cl)
    at_most = [f"{r['method']} {r['small']:.2f}" for r in cl if r["tasks_before"] == most]
    first = f"after {most} tasks: {', '.join(at_most)} vs Individual {ind[0]:.2f}"
    second = f"Individual {ind[0]:.2f} (paper: about 68 on SplitCIFAR100)"
    trends = []
    for method in dict.fromkeys(r["method"] for r in cl):
        mine = [r for r in cl if r["method"] == method]
        trends.append(f"{method} " + " -> ".join(f"{r['small']:.1f}" for r in mine))
    third = "by tasks before: " + "; ".join(trends)
    return [first, second, third]


def efficiency_plot(table: Table, path: Path) -> None:
    """Small-task accuracy against the number of full-data tasks learned before, per method;
    Individual as a dashed line; the paper's stated levels (68%, 75%) dotted."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for method in dict.fromkeys(r["method"] for r in table.rows if r["tasks_before"] is not None):
        mine = [r for r in table.rows if r["method"] == method]
        error_line(ax, mine, "tasks_before", "small", method)
    for r in table.rows:
        if r["tasks_before"] is None:
            ax.axhline(r["small"], ls="--", color="tab:red", label=f"{r['method']} (ours)")
    numbers = paper_numbers()["fig-data-efficiency"]["numbers"]
    paper = {"individual": ("gray", "Individual ≈68%"), "espn_packnet_above": ("black", "CL > 75%")}
    for key, (colour, text) in paper.items():
        ax.axhline(numbers[key], ls=":", color=colour, label=f"paper: {text} (SplitCIFAR100)")
    line_axes(ax, "tasks learned before the small tasks")
    ax.set_ylabel("small-task test accuracy (%)")
    ax.set_title(figure_title("Fig. 2a", table), fontsize=9)
    save_figure(fig, path)


FIG_DATA_EFFICIENCY = Target(
    name="fig-data-efficiency",
    title="Data efficiency: small tasks learned on supernets after K tasks vs Individual (Fig. 2a)",
    default_seeds={"smoke": 1, "cpu": 1, "paper": 1},
    stages=efficiency_stages,
    table=efficiency_table,
    plot=efficiency_plot,
    cost={
        "smoke": "4 runs of 1-3 tasks x 16-64 images, seconds each",
        "cpu": "19 runs: per method (3) a run of 10 rotated Fashion-MNIST tasks (8 x 1000 "
        "images, then 2 x 100) and 5 runs of the 2 small tasks on its supernets after 0-8 "
        "tasks; Individual",
        "paper": "3 SplitCIFAR100 runs of 20 tasks, 48 runs of 5 small tasks (3 on a fresh "
        "supernet, 45 on theirs) and Individual, 250 epochs per task, on a GPU",
    },
)

for _target in (TABLE_IMAGENET, FIG_DATA_EFFICIENCY):
    TARGETS.register(_target.name)(_target)
