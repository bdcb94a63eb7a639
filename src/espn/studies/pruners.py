"""The appendix experiment: accuracy and fraction of units kept against the FLOPs budget
gamma, for each channel/neuron pruner, on one task without continual learning.

Every point is one ``individual`` run (a network trained from scratch on the benchmark's
first task and pruned to ``gamma`` x the dense FLOPs with the given pruner, no weight
budget), a point of a sweep (:mod:`espn.sweep`) written to ``OUT/<pruner>-gamma<gamma>/``
like any ``espn run``; the study then collects them into ``OUT/pruners.csv`` and the
two-panel ``OUT/pruners.png``. Finished points are reused and killed ones resumed, so a
killed study continues where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from espn.sweep import Point, SweepError, run_sweep
from espn.utils.io import atomic_target
from espn.utils.io import read_csv as io_read_csv
from espn.utils.io import write_csv as io_write_csv

#: the appendix's FLOPs budgets
DEFAULT_GAMMAS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
DEFAULT_PRUNERS = ("flop-aware", "l1", "polarization")
CSV_FIELDS = ("pruner", "gamma", "accuracy", "flops_ratio", "units_kept", "seconds", "run")


@dataclass(frozen=True)
class StudyPoint:
    """One pruner at one FLOPs budget: test accuracy (%), FLOPs ratio, fraction of units kept."""

    pruner: str
    gamma: float
    accuracy: float
    flops_ratio: float
    units_kept: float
    seconds: float
    run: str


def pruner_points(
    base: dict[str, Any], pruners: Sequence[str], gammas: Sequence[float]
) -> list[Point]:
    """The sweep of the study: Individual-gamma with each pruner on the first task only,
    point ``<pruner>-gamma<gamma>``."""
    return [
        Point(
            f"{pruner}-gamma{gamma:g}",
            {**base, "method": "individual", "pruner": pruner, "gamma": gamma, "tasks": 1},
        )
        for pruner in pruners
        for gamma in gammas
    ]


def run_pruner_study(
    base: dict[str, Any],
    out: Path,
    pruners: tuple[str, ...] | list[str] = DEFAULT_PRUNERS,
    gammas: tuple[float, ...] | list[float] = DEFAULT_GAMMAS,
    progress: bool = True,
    on_point: Callable[[StudyPoint, bool], None] | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
) -> list[StudyPoint]:
    """Run (or reuse) every (pruner, gamma) point as a sweep (:func:`espn.sweep.run_sweep`,
    ``workers`` / ``ray_address`` as there), then write ``pruners.csv`` and ``pruners.png``
    in ``out``. ``base`` holds the other run options (benchmark, model, epochs, ...);
    ``on_point`` receives each point and whether it was reused. A failed point is an
    error naming its log, after the others ran (rerunning reuses them)."""
    out = Path(out)
    points = pruner_points(base, pruners, gammas)
    outcomes = run_sweep(points, out, workers=workers, ray_address=ray_address, progress=progress)
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        raise SweepError(
            f"{len(failed)} of {len(outcomes)} study point(s) failed: "
            + "; ".join(f"{o.point.name} ({o.error}; log: {o.log})" for o in failed)
        )
    study = []
    for o in outcomes:
        doc = o.results or {}
        point = StudyPoint(
            pruner=o.point.options["pruner"],
            gamma=o.point.options["gamma"],
            accuracy=float(doc["final_accuracy"][0]),
            flops_ratio=float(doc["flops_ratio"][0]),
            units_kept=float(doc["units_kept"][0]),
            seconds=float(doc["wall_time_s"]),
            run=o.point.name,
        )
        study.append(point)
        if on_point is not None:
            on_point(point, o.status == "reused")
    write_csv(study, out / "pruners.csv")
    model = (outcomes[0].results or {}).get("model") if outcomes else None
    plot_pruner_study(study, out / "pruners.png", f"{base.get('benchmark')} on {model}")
    return study


def write_csv(points: list[StudyPoint], path: Path) -> None:
    """One row per point, atomically."""
    io_write_csv(path, [asdict(p) for p in points], CSV_FIELDS)


def read_csv(path: Path) -> list[StudyPoint]:
    """The points of a ``pruners.csv``."""
    return [
        StudyPoint(
            pruner=r["pruner"],
            gamma=float(r["gamma"]),
            accuracy=float(r["accuracy"]),
            flops_ratio=float(r["flops_ratio"]),
            units_kept=float(r["units_kept"]),
            seconds=float(r["seconds"]),
            run=r["run"],
        )
        for r in io_read_csv(path)
    ]


def plot_pruner_study(points: list[StudyPoint], path: Path, title: str = "") -> None:
    """Two panels against gamma (log scale), one line per pruner: test accuracy, and the
    fraction of units (neurons/channels) kept, as in the paper's appendix figure."""
    fig, (ax_acc, ax_kept) = plt.subplots(1, 2, figsize=(11, 4))
    for pruner in dict.fromkeys(p.pruner for p in points):
        mine = sorted((p for p in points if p.pruner == pruner), key=lambda p: p.gamma)
        gammas = [p.gamma for p in mine]
        ax_acc.plot(gammas, [p.accuracy for p in mine], marker="o", label=pruner)
        ax_kept.plot(gammas, [p.units_kept for p in mine], marker="o", label=pruner)
    for ax in (ax_acc, ax_kept):
        ax.set_xscale("log")
        ax.set_xlabel("FLOPs constraint gamma")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax_acc.set(ylabel="test accuracy (%)", title=f"Test accuracy {title}".strip())
    ax_kept.set(ylabel="fraction of units kept", title="Fraction of nonzero units")
    ax_kept.set_ylim(0, 1.02)
    fig.tight_layout()
    with atomic_target(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
