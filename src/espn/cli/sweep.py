"""``espn sweep SPEC --out DIR``: a grid of ``espn run`` options, run on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from espn.utils.commands import (
    CPUS_PER_RUN_OPTION,
    OVERWRITE_POINTS_OPTION,
    POINT_PROGRESS_OPTION,
    RAY_ADDRESS_OPTION,
    WORKERS_OPTION,
    UserError,
    console,
    run_dir_option,
    user_errors,
)
from espn.utils.text import printable

if TYPE_CHECKING:
    from espn.sweep import PointOutcome


def sweep_summary(outcomes: list[PointOutcome], out: Path) -> None:
    """Print the outcomes as a table, then the summary per series across seeds (written to
    OUT/summary.csv/.md/.png); exit non-zero (2) naming the failed points' logs."""
    from espn.sweep.summary import summary_rows, write_summary

    table = Table("point", "status", "average acc %", "seconds")
    for o in outcomes:
        acc = (o.results or {}).get("average_accuracy")
        table.add_row(
            printable(o.point.name),
            o.status,
            "-" if acc is None else f"{acc:.2f}",
            f"{o.seconds:.1f}",
        )
    console.print(table)
    files = write_summary(outcomes, out)
    series = Table(
        "series", "runs", "average acc % (mean ± se)", "FLOPs ratio", title="per series, over seeds"
    )
    for row in summary_rows(outcomes)[1]:
        acc, se = row["average_accuracy"], row["average_accuracy_se"]
        ratio = row["flops_ratio"]
        series.add_row(
            row["series"],
            str(row["runs"]),
            "-" if acc is None else f"{acc:.2f}" + ("" if se is None else f" ± {se:.2f}"),
            "-" if ratio is None else f"{ratio:.3f}",
        )
    console.print(series)
    console.print("wrote " + ", ".join(map(str, files)))
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        raise UserError(
            f"{len(failed)} of {len(outcomes)} point(s) failed: "
            + "; ".join(f"{o.point.name} ({o.error}; log: {o.log})" for o in failed)
            + "; rerun the same command to retry them (finished points are reused)"
        )
    console.print(f"{len(outcomes)} point(s) in {out}")


@user_errors
def sweep(
    spec: Path = typer.Argument(..., help="Sweep spec, .json or .yaml: base options and a grid."),
    out: Path = typer.Option(
        ..., parser=run_dir_option, help="Sweep directory: one `espn run` directory per point."
    ),
    workers: int | None = WORKERS_OPTION,
    ray_address: str | None = RAY_ADDRESS_OPTION,
    cpus_per_run: float = CPUS_PER_RUN_OPTION,
    gpus_per_run: float = typer.Option(0.0, help="GPUs Ray reserves for each point."),
    progress: bool = POINT_PROGRESS_OPTION,
    overwrite: bool = OVERWRITE_POINTS_OPTION,
) -> None:
    """Run every point of a grid of `espn run` options (reusing finished points, resuming
    killed ones); one point's failure does not stop the others. Writes OUT/summary.csv, .md
    and .png: per series (points differing only in seed) mean, standard error and count."""
    from espn.sweep import expand_spec, load_spec, run_sweep

    points = expand_spec(load_spec(spec))
    outcomes = run_sweep(
        points,
        out,
        workers=workers,
        ray_address=ray_address,
        cpus_per_run=cpus_per_run,
        gpus_per_run=gpus_per_run,
        progress=progress,
        overwrite=overwrite,
    )
    sweep_summary(outcomes, out)
