"""``espn study pruners``: the paper's appendix experiment from the command line."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from espn.cli.common import command_group, console, parse_epochs, user_errors
from espn.config import ConfigError
from espn.pruning.pruner import PRUNERS
from espn.studies.pruners import DEFAULT_GAMMAS, DEFAULT_PRUNERS, StudyPoint

app = command_group(help="Studies that put several runs side by side.", no_args_is_help=True)


def parse_gammas(text: str) -> list[float]:
    """``"0.01,0.1"`` -> [0.01, 0.1]; each must be a number in (0, 1]."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise ConfigError(f"--gammas must be numbers in (0, 1] separated by commas, got {text!r}")
    bad = [v for v in values if not 0.0 < v <= 1.0]
    if bad:
        raise ConfigError(f"--gammas: every gamma must be in (0, 1], got {bad[0]:g}")
    _no_repeats("--gammas", [f"{v:g}" for v in values])
    return values


def _no_repeats(option: str, values: list[str]) -> None:
    """A study point given twice would be run and reported twice: refuse it."""
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise ConfigError(f"{option}: {', '.join(repeated)} given more than once; list each once")


def parse_pruners(text: str) -> list[str]:
    """``"l1,polarization"`` -> ["l1", "polarization"], each a registered pruner."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise ConfigError(f"--pruners must name pruners separated by commas, got {text!r}")
    for name in names:
        PRUNERS.get(name)
    _no_repeats("--pruners", names)
    return names


@app.command()
@user_errors
def pruners(
    out: Path = typer.Option(..., help="Study directory: one run per point, pruners.csv/.png."),
    benchmark: str = typer.Option(
        "fashion-mnist", help="Benchmark whose first task is learned (e.g. cifar10 on a GPU)."
    ),
    model: str | None = typer.Option(None, help="Model; default: the benchmark's."),
    gammas: str = typer.Option(
        ",".join(f"{g:g}" for g in DEFAULT_GAMMAS), help="FLOPs budgets, comma-separated."
    ),
    pruner_names: str = typer.Option(
        ",".join(DEFAULT_PRUNERS), "--pruners", help="Pruners to compare, comma-separated."
    ),
    epochs: str | None = typer.Option(None, help="PRE,PRUNE,FINE epochs; default: benchmark's."),
    train_per_task: int | None = typer.Option(None, help="Keep N training images."),
    test_per_task: int | None = typer.Option(None, help="Keep N test images."),
    optimizer: str | None = typer.Option(None, help="sgd, adam or rmsprop."),
    lr: float | None = typer.Option(None, help="Learning rate; default: the benchmark's."),
    batch_size: int | None = typer.Option(None, help="Batch size; default: the benchmark's."),
    penalty: float = typer.Option(1e-4, help="Strength of every pruner's sparsity penalty."),
    seed: int = typer.Option(0, help="Seed of data subsets, order and initialisation."),
    device: str = typer.Option("cpu", help="cpu, cuda or cuda:N."),
    data_dir: Path | None = typer.Option(None, help="Dataset root."),
    progress: bool = typer.Option(
        True, help="Bar over points and a line per finished point (else lines at the end)."
    ),
    workers: int | None = typer.Option(
        None,
        help="Points run at once on an embedded local Ray (default: GPUs, else CPU cores); "
        "1 runs them one after another in this process, without Ray.",
    ),
    ray_address: str | None = typer.Option(None, help="Run on this existing Ray cluster."),
) -> None:
    """Accuracy and fraction of units kept against gamma for each pruner, on one task.

    Each point is an Individual-gamma run (train from scratch, prune to gamma x the dense
    FLOPs, no weight budget) in OUT/<pruner>-gamma<g>/, run as a sweep (see `espn sweep`):
    finished points are reused, killed ones resumed.
    """
    from espn.studies.pruners import run_pruner_study

    base = {
        "benchmark": benchmark,
        "model": model,
        "epochs": parse_epochs(epochs),
        "train_per_task": train_per_task,
        "test_per_task": test_per_task,
        "optimizer": optimizer,
        "lr": lr,
        "batch_size": batch_size,
        "penalty": penalty,
        "seed": seed,
        "device": device,
        "data_dir": data_dir,
    }

    def report(point: StudyPoint, reused: bool) -> None:
        console.print(
            f"{point.pruner} gamma={point.gamma:g}: accuracy {point.accuracy:.2f}%, "
            f"FLOPs {point.flops_ratio:.4f}, units kept {point.units_kept:.3f}"
            + (" (reused)" if reused else f" ({point.seconds:.1f}s)")
        )

    points = run_pruner_study(
        base,
        out,
        parse_pruners(pruner_names),
        parse_gammas(gammas),
        progress,
        None if progress else report,
        workers=workers,
        ray_address=ray_address,
    )
    table = Table("pruner", "gamma", "accuracy %", "FLOPs ratio", "units kept")
    for p in points:
        table.add_row(
            p.pruner,
            f"{p.gamma:g}",
            f"{p.accuracy:.2f}",
            f"{p.flops_ratio:.4f}",
            f"{p.units_kept:.3f}",
        )
    console.print(table)
    console.print(f"wrote {out / 'pruners.csv'} and {out / 'pruners.png'}")
