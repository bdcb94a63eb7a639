"""``espn reproduce TARGET --scale S --out DIR``, ``espn reproduce list`` and
``espn reproduce report DIR``: the paper's tables and figures from one command."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from espn.reproduce import SCALES, TARGETS, Options, TargetResult, report, run_target
from espn.utils.commands import (
    CPUS_PER_RUN_OPTION,
    OVERWRITE_POINTS_OPTION,
    POINT_PROGRESS_OPTION,
    RAY_ADDRESS_OPTION,
    WORKERS_OPTION,
    UserError,
    command_group,
    console,
    fail,
    labelled,
    run_dir_option,
    user_errors,
)
from espn.utils.text import printable


class _TargetGroup(TyperGroup):
    """Subcommands: one per target, ``list`` and ``report``; any other name is refused with
    the accepted ones."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            fail(
                f"unknown target {name!r}; choose one of: {', '.join(TARGETS.names())} "
                "(or `list`, `report DIR`)"
            )
        return super().resolve_command(ctx, args)


app = command_group(
    cls=_TargetGroup,
    help="Reproduce the paper's tables and figures: espn reproduce TARGET --scale "
    f"{{{','.join(SCALES)}}} --out DIR; `espn reproduce list` names the targets.",
    no_args_is_help=True,
)


@app.command("list")
@user_errors
def list_targets() -> None:
    """The targets, what they reproduce and their cost at each scale."""
    for name in TARGETS:
        t = TARGETS.get(name)
        console.print(labelled(f"{name}:", "bold", t.title), highlight=False)
        for s in SCALES:
            console.print(f"    {s}: {t.cost[s]}", highlight=False)


@app.command("report")
@user_errors
def report_command(
    out: Path = typer.Argument(..., help="The --out of `espn reproduce`."),
    target: list[str] | None = typer.Option(
        None, help="Only this target (repeatable); default: every target found in DIR."
    ),
) -> None:
    """Rebuild TARGET.csv/.md/.png of every target in DIR from its run directories alone."""
    for result in report(out, target or None):
        _written(result.files, result.table.incomplete)


def _written(files: list[Path], incomplete: list[str]) -> None:
    if incomplete:
        console.print(
            labelled("not in the table (no finished results):", "yellow", ", ".join(incomplete)),
            highlight=False,
        )
    console.print("wrote " + ", ".join(str(f) for f in files))


@user_errors
def target_command(
    ctx: typer.Context,
    scale: str = typer.Option(
        ...,
        help="smoke: seconds (tiny data, 1 seed); cpu: minutes on 2 cores, Fashion-MNIST "
        "where the paper's data are absent; paper: the paper's full recipe (GPU).",
    ),
    out: Path = typer.Option(
        ...,
        parser=run_dir_option,
        help="Directory of the run directories and TARGET.csv/.md/.png.",
    ),
    seeds: int | None = typer.Option(
        None, help="Number of seeds (0..N-1); default: the target's at the scale."
    ),
    workers: int | None = WORKERS_OPTION,
    ray_address: str | None = RAY_ADDRESS_OPTION,
    cpus_per_run: float = CPUS_PER_RUN_OPTION,
    gpus_per_run: float | None = typer.Option(
        None, help="GPUs Ray reserves for each point; default 1 with a CUDA --device, else 0."
    ),
    device: str = typer.Option("cpu", help="cpu, cuda or cuda:N (every point)."),
    data_dir: Path | None = typer.Option(
        None, help="Dataset root of MNIST/CIFAR (default $ESPN_DATA or ~/.cache/espn/data)."
    ),
    data_root: Path | None = typer.Option(
        None,
        help="table-imagenet: directory holding imagenet/, cubs/, cars/, flowers/, "
        "wikiart/, sketch/ (ImageFolder layout).",
    ),
    init_weights: Path | None = typer.Option(
        None, help="table-imagenet: sparse pretrained ResNet50 adopted as the ImageNet task."
    ),
    model: str | None = typer.Option(
        None, help="Run every point on this model instead of the target's (`espn list`)."
    ),
    progress: bool = POINT_PROGRESS_OPTION,
    overwrite: bool = OVERWRITE_POINTS_OPTION,
) -> None:
    """``espn reproduce TARGET``: the command of every target (its name is the command's)."""
    result = run_target(
        ctx.info_name or "",
        Options(**{f.name: ctx.params[f.name] for f in fields(Options)}),
        out,
        workers=workers,
        ray_address=ray_address,
        cpus_per_run=cpus_per_run,
        gpus_per_run=float(device.startswith("cuda")) if gpus_per_run is None else gpus_per_run,
        progress=progress,
        overwrite=overwrite,
    )
    console.print(printable(result.table.markdown(), lines=True), highlight=False)
    _written(result.files, result.table.incomplete)
    _refuse_incomplete(result)


def _refuse_incomplete(result: TargetResult) -> None:
    """Name the points that stopped early; fail, naming each and its log, when some points
    have no results (the table was written with the others)."""
    for o in result.outcomes:  # e.g. stopped out of capacity, still in a partial table
        if o.status == "failed" and o.point.name not in result.table.incomplete:
            console.print(labelled("stopped early:", "yellow", f"{o.point.name}: {o.error}"))
    if result.table.incomplete:
        failed = [o for o in result.outcomes if o.point.name in result.table.incomplete]
        skipped = f"; not run, their source failed: {', '.join(result.skipped)}"
        raise UserError(
            f"{len(result.table.incomplete)} point(s) have no results: "
            + "; ".join(f"{o.point.name} ({o.error}; log: {o.log})" for o in failed)
            + (skipped if result.skipped else "")
            + "; the table has the others; rerun the same command to retry them "
            "(finished points are reused)"
        )


for _name in TARGETS:
    app.command(_name, help=TARGETS.get(_name).title)(target_command)
