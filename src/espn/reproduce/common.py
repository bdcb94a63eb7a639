"""Pieces shared by the targets: the CPU recipes, method labels, grouping runs by series,
and writing a figure atomically."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from espn.reproduce.table import Table, scale_banner
from espn.reproduce.target import Run
from espn.settings.recipes import MNIST
from espn.utils.plotting import write_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: the paper's FC1024 recipe (:data:`espn.settings.recipes.MNIST`: RMSprop lr 1e-3, batch 256,
#: 3 + 4 + 3 epochs, the authors' 1-epoch warm-up and constant 1e-4 fine-tuning), given
#: explicitly (so its epochs are taken as given, and its alpha is the benchmark's) for the
#: split Fashion-MNIST stand-in of SplitCIFAR100 on the CPU
FC_RECIPE: dict[str, Any] = {
    key: MNIST[key]
    for key in (
        "model",
        "optimizer",
        "lr",
        "batch_size",
        "epochs",
        "warmup",
        "finetune_lr",
        "finetune_schedule",
    )
}
#: the SplitCIFAR100 regime on the CPU: the paper's recipe (``paper`` preset, each method's
#: own recipe over it) on split Fashion-MNIST tasks of 2500 training images (the size of a
#: SplitCIFAR100 task) and FC1024: batch 128 x 250 epochs = the paper's 5000 steps per task
CIFAR_REGIME: dict[str, Any] = {
    "preset": "paper",
    "benchmark": "split-fashion-mnist",
    "model": "fc1024",
    "train_per_task": 2500,
}
#: seconds-long runs: one epoch per phase on a few dozen images
SMOKE: dict[str, Any] = {
    "epochs": [1, 1, 1],
    "train_per_task": 64,
    "test_per_task": 32,
    "batch_size": 32,
}

#: the paper's name of each method setting used by the targets: series -> (label, options)
METHOD_SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "individual-0.2": ("Individual-0.2", {"method": "individual", "gamma": 0.2}),
    "individual-1": ("Individual-1", {"method": "individual", "gamma": 1.0}),
    "mtl": ("MTL", {"method": "mtl"}),
    "packnet": ("PackNet", {"method": "packnet"}),
    "supsup": ("SupSup", {"method": "supsup"}),
    "cpg": ("CPG", {"method": "cpg"}),
    "rmn": ("RMN", {"method": "rmn"}),
    "espn-0.2": ("ESPN-0.2", {"method": "espn", "gamma": 0.2}),
    "espn-0.5": ("ESPN-0.5", {"method": "espn", "gamma": 0.5}),
    "espn-1": ("ESPN-1", {"method": "espn", "gamma": 1.0}),
}


def label(series: str) -> str:
    """The paper's name of a method series (``espn-0.2`` -> ``ESPN-0.2``)."""
    return METHOD_SETTINGS[series][0] if series in METHOD_SETTINGS else series


#: at smoke scale (one step per phase) CPG's and RMN's own rules keep every weight for the first
#: task, and the run stops before the second (no capacity left): these cap what a task keeps
SMOKE_CAPS: dict[str, dict[str, Any]] = {
    "cpg": {"cpg_train_acc": 0.0},
    "rmn": {"rmn_budget": 0.5},
}


def method_options(
    series: str, alpha: float | None = None, scale: str | None = None
) -> dict[str, Any]:
    """``make_config`` options of a method series; ``alpha`` only where the method has a
    weight budget of the recipe's (Individual keeps none, as in the paper); at ``scale``
    ``smoke``, CPG's and RMN's caps (:data:`SMOKE_CAPS`)."""
    from espn.methods import METHODS

    options = dict(METHOD_SETTINGS[series][1])
    if scale == "smoke":
        options |= SMOKE_CAPS.get(options["method"], {})
    strategy = METHODS.get(options["method"])
    if alpha is not None and strategy.takes_recipe_alpha():
        options["alpha"] = alpha
    return options


def by_series(runs: Iterable[Run]) -> dict[str, list[Run]]:
    """Runs grouped by series, each group sorted by seed."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.series].append(run)
    return {k: sorted(v, key=lambda r: r.seed) for k, v in groups.items()}


def ordered(keys: Iterable[str], order: list[str]) -> list[str]:
    """``keys`` in ``order``'s order, any others after them, sorted."""
    keys = list(keys)
    return [k for k in order if k in keys] + sorted(k for k in keys if k not in order)


def mean_of(values: list[float]) -> float:
    """Plain mean (values non-empty)."""
    return sum(values) / len(values)


def legend_outside_with_grid(ax: Axes) -> None:
    """The bar charts' finish: the legend right of the axes, horizontal grid lines."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)


def line_axes(ax: Axes, xlabel: str, legend_size: int = 7) -> None:
    """The line charts' finish: ``xlabel`` with integer ticks (task IDs or counts), a grid and
    a small legend."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=legend_size)


def error_line(ax: Axes, rows: list[dict[str, Any]], x: str, y: str, label: str) -> None:
    """Column ``y`` of ``rows`` against column ``x``, its standard error (``y_se``; missing:
    none) as error bars."""
    ys, errs = [r[y] for r in rows], [r[f"{y}_se"] or 0.0 for r in rows]
    ax.errorbar([r[x] for r in rows], ys, yerr=errs, marker="o", capsize=3, label=label)


def save_figure(fig: Figure, path: Path) -> None:
    """Lay ``fig`` out tightly, write it as PNG atomically (its title, the scale first below
    the paper's, also as the PNG's ``Title``) and close it."""
    suptitle = fig.get_suptitle()
    title = suptitle or next((t for ax in fig.axes if (t := ax.get_title())), "")
    write_figure(fig, path, metadata={"Title": title.replace("\n", ": ")})


def known(*values: float | None) -> list[float] | None:
    """``values`` as floats when none is missing, else None."""
    return None if any(v is None for v in values) else [float(v) for v in values if v is not None]


def signed(value: float) -> str:
    """A difference in points with its sign: ``+1.23`` / ``-0.40`` (``+0.00``, never ``-0.00``)."""
    value = 0.0 if round(value, 2) == 0 else value
    return f"{value:+.2f}"


def figure_title(what: str, table: Table) -> str:
    """The figure title: below the paper's scale the scale on a line of its own first; and
    saying when the data stand in for the paper's."""
    stand_in = any(n.startswith("data:") for n in table.notes)
    banner = scale_banner(table.scale)
    title = what + (" — ours on Fashion-MNIST stand-in data" if stand_in else "")
    return f"{banner}\n{title}" if banner else title


def planned_steps(options: dict[str, Any], task_size: int) -> list[tuple[str, int]]:
    """(phase, optimizer steps) of one task of ``task_size`` training images of a point with
    ``options``, the size rule included: what the engine will run (a phase the method may
    skip, e.g. a later CPG compacting round, counted as planned), from the configuration
    alone."""
    from espn.methods import METHODS
    from espn.runs.config import make_config
    from espn.training.plan import plan_phase, reference_batches

    cfg = make_config(**options)
    batch = cfg.batch_size
    per_epoch = math.ceil(task_size / batch)
    per_reference = reference_batches(cfg.floor_reference(), batch)
    strategy = METHODS.get(cfg.method)(cfg.method_config())
    return [(p.name, plan_phase(p, per_epoch, per_reference).steps) for p in strategy.phases()]


def run_steps(run: Run) -> list[tuple[str, int]] | None:
    """(phase, optimizer steps) the run's first task ran (None: recorded by an older espn)."""
    phases = run.doc.get("phases")
    if not phases or not phases[0]:
        return None
    return [(str(p["phase"]), int(p["steps"])) for p in phases[0]]


def steps_note(
    runs: Iterable[Run], paper_steps: Callable[[str], list[tuple[str, int]] | None]
) -> str:
    """One line: per series, the optimizer steps per phase of its first task, ours / the
    paper's (``paper_steps(series)``, None where the paper has no such run)."""
    parts = []
    for series, rs in by_series(runs).items():
        ours = run_steps(rs[0])
        if ours is None:
            continue
        theirs = dict(paper_steps(series) or [])
        text = ", ".join(f"{name} {n}/{theirs.get(name, '-')}" for name, n in ours)
        parts.append(f"{label(series)}: {text}")
    return "optimizer steps per phase of a task, ours/the paper's: " + (
        "; ".join(parts) if parts else "not recorded by these runs"
    )
