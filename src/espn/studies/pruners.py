"""The appendix experiment: accuracy and fraction of units kept against the FLOPs budget
gamma, for each channel/neuron pruner, on one task without continual learning.

Every point is one ``individual`` run (a network trained from scratch on the benchmark's
first task and pruned to ``gamma`` x the dense FLOPs with the given pruner, no weight
budget), written to ``OUT/<pruner>-gamma<gamma>/`` like any ``espn run``; the study then
collects them into ``OUT/pruners.csv`` and the two-panel ``OUT/pruners.png``. Runs whose
complete ``results.json`` was made with the same options are reused, so a killed study
continues where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from espn.checkpoint.run import option_differences, saved_config
from espn.config import RunConfig, make_config
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


def point_config(base: dict[str, Any], pruner: str, gamma: float, out: Path) -> RunConfig:
    """The run of one point: Individual-gamma with ``pruner`` on the first task only."""
    run_dir = out / f"{pruner}-gamma{gamma:g}"
    return make_config(
        **base, method="individual", pruner=pruner, gamma=gamma, tasks=1, out=run_dir
    )


def _finished(cfg: RunConfig) -> dict[str, Any] | None:
    """The results of an earlier complete run of exactly ``cfg`` (output path aside), if any."""
    path = Path(cfg.out) / "results.json"
    try:
        doc = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    same = not option_differences(doc.get("config", {}), cfg)
    return doc if doc.get("complete") and same else None


def _resumable(cfg: RunConfig) -> bool:
    """Whether ``cfg.out`` holds a checkpoint of the same options (a killed point)."""
    saved = saved_config(cfg.out)
    return saved is not None and not option_differences(saved, cfg)


def run_pruner_study(
    base: dict[str, Any],
    out: Path,
    pruners: tuple[str, ...] | list[str] = DEFAULT_PRUNERS,
    gammas: tuple[float, ...] | list[float] = DEFAULT_GAMMAS,
    progress: bool = True,
    on_point: Callable[[StudyPoint, bool], None] | None = None,
) -> list[StudyPoint]:
    """Run (or reuse) every (pruner, gamma) point, then write ``pruners.csv`` and
    ``pruners.png`` in ``out``. ``base`` holds the other run options (benchmark, model,
    epochs, ...); ``on_point`` receives each point and whether it was reused."""
    from espn.experiment import run_experiment

    configs = [(p, g, point_config(base, p, g, out)) for p in pruners for g in gammas]
    points = []
    for pruner, gamma, cfg in configs:  # all options are validated before the first run
        doc = _finished(cfg)
        reused = doc is not None
        if doc is None:
            resume = _resumable(cfg)  # a killed point goes on; one of other options is redone
            doc = run_experiment(cfg, progress=progress, resume=resume, overwrite=not resume)
        point = StudyPoint(
            pruner=pruner,
            gamma=gamma,
            accuracy=float(doc["final_accuracy"][0]),
            flops_ratio=float(doc["flops_ratio"][0]),
            units_kept=float(doc["units_kept"][0]),
            seconds=float(doc["wall_time_s"]),
            run=str(Path(cfg.out).relative_to(out)),
        )
        points.append(point)
        if on_point is not None:
            on_point(point, reused)
    write_csv(points, out / "pruners.csv")
    title = f"{base.get('benchmark')} on {configs[0][2].model}" if configs else ""
    plot_pruner_study(points, out / "pruners.png", title)
    return points


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
