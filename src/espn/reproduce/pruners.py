"""The appendix's Fig. 5: the pruner comparison (5a/5b, one task, no continual learning) and the
weight allocation study (5c: ESPN accuracy over alpha x gamma); see docs/reproduce.md."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from espn.reproduce.common import (
    SMOKE,
    error_line,
    figure_title,
    mean_of,
    save_figure,
    signed,
    steps_note,
)
from espn.reproduce.continual import split_base, split_paper_steps
from espn.reproduce.paper import claims_notes, data_notes
from espn.reproduce.table import Table
from espn.reproduce.target import TARGETS, Options, Run, Target
from espn.utils.plotting import pyplot
from espn.utils.stats import mean_se

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from espn.sweep import Point

#: the appendix's FLOPs budgets and pruners
DEFAULT_GAMMAS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
DEFAULT_PRUNERS = ("flop-aware", "l1", "polarization")

SCALES: dict[str, tuple[dict[str, Any], tuple[float, ...]]] = {
    # CIFAR-10 with the Table 1 recipe (the paper's "same architecture and hyperparameters")
    "paper": ({"preset": "paper", "benchmark": "cifar10"}, DEFAULT_GAMMAS),
    # one task of 3000 images at the MNIST epochs as given (the size rule off): the paper's
    # CIFAR-10 regime (97750 steps per run) is out of a CPU's reach, and 36 runs at the
    # rule's 2350 steps would take hours; this target's cpu scale is not the paper's regime
    "cpu": (
        {"benchmark": "fashion-mnist", "train_per_task": 3000, "step_floor": False},
        DEFAULT_GAMMAS,
    ),
    "smoke": ({"benchmark": "fashion-mnist"} | SMOKE, (0.1, 0.5)),
}


def pruner_stages(options: Options, out: Path) -> list[list[Point]]:
    """Every pruner at every gamma, per seed: an Individual-gamma run (trained from scratch,
    pruned to gamma x the dense FLOPs, no weight budget) of the benchmark's first task only."""
    base, gammas = SCALES[options.scale]
    base = base | {"method": "individual", "tasks": 1}
    return [
        [
            FIG_PRUNERS.point(
                options,
                f"{pruner}+gamma{gamma:g}",
                seed,
                base | {"pruner": pruner, "gamma": gamma},
            )
            for seed in FIG_PRUNERS.seeds(options)
            for pruner in DEFAULT_PRUNERS
            for gamma in gammas
        ]
    ]


def pruner_table(runs: list[Run]) -> Table:
    """Per pruner and gamma: test accuracy and units kept (mean ± se), FLOPs ratio."""
    groups: dict[tuple[str, float], list[Run]] = {}
    for r in runs:
        config = r.doc["config"]
        pruner = (config.get("method_options") or {}).get("pruner", config.get("pruner"))
        key = (str(pruner), float(r.doc["gamma"]))
        groups.setdefault(key, []).append(r)
    order = {p: i for i, p in enumerate(DEFAULT_PRUNERS)}
    columns = ["pruner", "gamma", "seeds", "accuracy", "accuracy_se", "flops_ratio"]
    columns += ["units_kept", "units_kept_se"]
    rows = []
    for (pruner, gamma), rs in sorted(
        groups.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0])
    ):
        row: dict[str, Any] = {"pruner": pruner, "gamma": gamma, "seeds": len(rs)}
        row["accuracy"], row["accuracy_se"] = mean_se(
            [float(r.doc["final_accuracy"][0]) for r in rs]
        )
        row["flops_ratio"] = mean_of([float(r.doc["flops_ratio"][0]) for r in rs])
        row["units_kept"], row["units_kept_se"] = mean_se(
            [float(r.doc["units_kept"][0]) for r in rs]
        )
        rows.append(row)
    table = Table("fig-pruners", FIG_PRUNERS.title, columns, rows)
    notes = data_notes(runs, "resnet18-reduced")
    table.notes = notes + claims_notes("fig-pruners", _observations(table))
    return table


def _observations(table: Table) -> list[str]:
    acc = {(r["pruner"], r["gamma"]): r["accuracy"] for r in table.rows}
    kept = {(r["pruner"], r["gamma"]): r["units_kept"] for r in table.rows}
    gammas = sorted({g for _, g in acc})
    if not gammas:
        return []
    low = gammas[0]
    first = ", ".join(
        f"flop-aware minus {p}: {signed(acc['flop-aware', low] - acc[p, low])} at gamma {low:g}, "
        f"{signed(mean_of([acc['flop-aware', g] - acc[p, g] for g in gammas]))} averaged over gamma"
        for p in ("l1", "polarization")
        if ("flop-aware", low) in acc and (p, low) in acc
    )
    below = [g for g in gammas if g < 0.5 and ("polarization", g) in acc]
    second = (
        "polarization below gamma 0.5: "
        + ", ".join(f"{acc['polarization', g]:.2f}% at {g:g}" for g in below)
        + " (flop-aware: "
        + ", ".join(f"{acc['flop-aware', g]:.2f}%" for g in below if ("flop-aware", g) in acc)
        + ")"
        if below
        else "no gamma below 0.5 was run"
    )
    more = [
        g
        for g in gammas
        if all(
            kept.get(("flop-aware", g), -1) >= kept.get((p, g), 2) for p in ("l1", "polarization")
        )
    ]
    third = f"flop-aware keeps the most units at {len(more)} of {len(gammas)} gammas"
    return [first or "needs flop-aware and the others", second, third]


def against_gamma(
    ax: Axes, rows: list[dict[str, Any]], by: str, y: str, name: Callable[[Any], str] = str
) -> None:
    """Per value of column ``by`` (in row order), a line of ``y`` ± its standard error
    against gamma, on a log scale."""
    for value in dict.fromkeys(r[by] for r in rows):
        mine = sorted((r for r in rows if r[by] == value), key=lambda r: r["gamma"])
        error_line(ax, mine, "gamma", y, name(value))
    ax.set_xscale("log")
    ax.set_xlabel("FLOPs constraint gamma")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def pruner_plot(table: Table, path: Path) -> None:
    """Two panels against gamma (log scale), one line per pruner: test accuracy and the
    fraction of units kept (the paper's Fig. 5a/5b give curves only)."""
    plt = pyplot()
    fig, (ax_acc, ax_kept) = plt.subplots(1, 2, figsize=(11, 4))
    against_gamma(ax_acc, table.rows, "pruner", "accuracy")
    against_gamma(ax_kept, table.rows, "pruner", "units_kept")
    ax_acc.set(ylabel="test accuracy (%)", title=figure_title("Fig. 5a", table))
    ax_kept.set(ylabel="fraction of units kept", title="Fig. 5b: fraction of nonzero units")
    ax_kept.set_ylim(0, 1.02)
    save_figure(fig, path)


FIG_PRUNERS = Target(
    name="fig-pruners",
    title="Channel/neuron pruners: accuracy and units kept against gamma, one task (Fig. 5a/5b)",
    default_seeds={"smoke": 1, "cpu": 2, "paper": 5},
    stages=pruner_stages,
    table=pruner_table,
    plot=pruner_plot,
    cost={
        "smoke": "6 runs of one task x 64 images, seconds each",
        "cpu": "36 runs (3 pruners x 6 gammas x 2 seeds) of one Fashion-MNIST task x 3000 images on FC1024",
        "paper": "90 runs (3 x 6 x 5 seeds) of CIFAR-10 x 250 epochs on a GPU",
    },
)

# -------------------------------------------------------------------------- fig-alpha-gamma
GRIDS = {
    "paper": ((0.01, 0.1, 0.5, 1.0), (0.01, 0.05, 0.1, 0.2, 0.5, 1.0)),
    "cpu": ((0.01, 0.1, 1.0), (0.05, 0.2, 1.0)),
    "smoke": ((0.1, 1.0), (0.2, 1.0)),
}


def alpha_gamma_stages(options: Options, out: Path) -> list[list[Point]]:
    """ESPN on the SplitCIFAR100 recipe (or its stand-in) at every alpha x gamma."""
    alphas, gammas = GRIDS[options.scale]
    base = split_base(options)
    if options.scale == "cpu":  # 3 tasks: 9 ESPN runs in about an hour on 2 cores
        base |= {"tasks": 3}
    return [
        [
            FIG_ALPHA_GAMMA.point(
                options,
                f"alpha{a:g}+gamma{g:g}",
                seed,
                base | {"method": "espn", "alpha": a, "gamma": g},
            )
            for a in alphas
            for g in gammas
            for seed in FIG_ALPHA_GAMMA.seeds(options)
        ]
    ]


def alpha_gamma_table(runs: list[Run]) -> Table:
    """Per (alpha, gamma): task-averaged ESPN accuracy (mean ± se) over the tasks learned,
    how many were (a run stops when no free weight is left for the next task) and the mean
    FLOPs ratio."""
    groups: dict[tuple[float, float], list[Run]] = {}
    for r in runs:
        groups.setdefault((float(r.doc["alpha"]), float(r.doc["gamma"])), []).append(r)
    columns = ["alpha", "gamma", "seeds", "tasks_learned", "avg", "avg_se", "flops_ratio"]
    rows = []
    for (a, g), rs in sorted(groups.items()):
        avg, se = mean_se([float(r.doc["average_accuracy"]) for r in rs])
        flops = mean_of([mean_of(r.doc["flops_ratio"]) for r in rs])
        learned = min(len(r.doc["final_accuracy"]) for r in rs)
        total = max(int(r.doc["config"]["tasks"]) for r in rs)
        row = {"alpha": a, "gamma": g, "seeds": len(rs), "tasks_learned": f"{learned}/{total}"}
        rows.append(row | {"avg": avg, "avg_se": se, "flops_ratio": flops})
    table = Table("fig-alpha-gamma", FIG_ALPHA_GAMMA.title, columns, rows)
    notes = data_notes(runs, "resnet18-reduced")
    notes.append(
        "the paper names alpha 0.1 (orange) and alpha 1 (red) only; the other alphas of the "
        "grid are our choice"
    )
    if any(not r.complete for r in runs):
        notes.append(
            "tasks_learned below the total: the run stopped when the next task would get no "
            "new weight (espn has no reuse-only mode); avg is over the tasks it learned"
        )
    notes.append(steps_note(runs, lambda s: split_paper_steps("espn-0.2")))
    table.notes = notes + claims_notes("fig-alpha-gamma", _alpha_gamma_observations(table))
    return table


def _alpha_gamma_observations(table: Table) -> list[str]:
    if not table.rows:
        return []
    alphas = sorted({r["alpha"] for r in table.rows})
    gammas = sorted({r["gamma"] for r in table.rows})
    acc = {(r["alpha"], r["gamma"]): r["avg"] for r in table.rows}
    learned = {(r["alpha"], r["gamma"]): r["tasks_learned"] for r in table.rows}
    whole = {k for k, v in learned.items() if v.split("/")[0] == v.split("/")[1]}

    def mean_over_gammas(a: float) -> float:
        return mean_of([acc[a, g] for g in gammas if (a, g) in acc])

    lo, hi = alphas[0], alphas[-1]
    mid = 0.1 if 0.1 in alphas else alphas[len(alphas) // 2]
    first = (
        f"mean over gamma: alpha {lo:g} {mean_over_gammas(lo):.2f} vs alpha {mid:g} "
        f"{mean_over_gammas(mid):.2f}"
    )
    g = gammas[-1]
    second = f"at gamma {g:g}: alpha {hi:g} " + (
        f"{acc[hi, g]:.2f} over the {learned[hi, g]} tasks it could learn (no weight left for "
        "the next)"
        if (hi, g) in acc and (hi, g) not in whole
        else f"{acc.get((hi, g), float('nan')):.2f}"
    )
    second += f" vs alpha {mid:g} {acc.get((mid, g), float('nan')):.2f}"
    best_gap = [
        max(acc[a, g] for a in alphas if (a, g) in whole) - acc[mid, g]
        for g in gammas
        if (mid, g) in whole
    ]
    rising = [acc[mid, g] for g in gammas if (mid, g) in acc]
    third = (
        f"alpha {mid:g} is at most {max(best_gap, default=0.0):.2f} points below the best alpha "
        f"that learned every task, at every gamma; its accuracy goes "
        f"{' -> '.join(f'{v:.2f}' for v in rising)} as gamma grows"
    )
    return [first, second, third]


def alpha_gamma_plot(table: Table, path: Path) -> None:
    """Task-averaged ESPN accuracy against gamma (log scale), one line per alpha."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    against_gamma(ax, table.rows, "alpha", "avg", lambda a: f"alpha {a:g}")
    ax.set_ylabel("task-averaged ESPN accuracy (%)")
    ax.set_title(figure_title("Fig. 5c (curves only in the paper)", table), fontsize=9)
    save_figure(fig, path)


FIG_ALPHA_GAMMA = Target(
    name="fig-alpha-gamma",
    title="Task-averaged ESPN accuracy over weight allocation alpha x FLOPs budget gamma (Fig. 5c)",
    default_seeds={"smoke": 1, "cpu": 1, "paper": 1},
    stages=alpha_gamma_stages,
    table=alpha_gamma_table,
    plot=alpha_gamma_plot,
    partial=True,
    cost={
        "smoke": "4 runs of 2 tasks x 64 images, seconds each",
        "cpu": "9 ESPN runs (3 alphas x 3 gammas) of 3 split Fashion-MNIST tasks x 2500 "
        "images at the paper's 5000 optimizer steps per task; see docs/recipes.md",
        "paper": "24 ESPN runs (4 alphas x 6 gammas) of 20 SplitCIFAR100 tasks x 250 epochs on a GPU",
    },
)

for _target in (FIG_PRUNERS, FIG_ALPHA_GAMMA):
    TARGETS.register(_target.name)(_target)
