"""``espn``: train, inspect and compare zero-forgetting continual learners."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from espn.cli import deploy, presets, study, theory
from espn.cli.common import parse_epochs, user_errors
from espn.data.registry import BENCHMARKS
from espn.methods.base import METHODS
from espn.models.registry import MODELS
from espn.pruning.pruner import PRUNERS

app = typer.Typer(
    help="Efficient Sparse PackNet: zero-forgetting, inference-efficient continual learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
app.add_typer(deploy.app)  # evaluate, export, info
app.add_typer(presets.app, name="presets")  # presets [show NAME]
app.add_typer(study.app, name="study")  # study pruners
app.add_typer(theory.app, name="theory")  # theory sample-complexity, mismatch, task-order, report


@app.command()
@user_errors
def run(
    ctx: typer.Context,
    benchmark: str | None = typer.Option(
        None, help="Benchmark name (see `espn list`); required unless the preset sets one."
    ),
    method: str = typer.Option("espn", help="Method: " + ", ".join(METHODS.names()) + "."),
    out: Path = typer.Option(
        ..., help="Run directory for results.json, accuracy.png and checkpoint/."
    ),
    model: str | None = typer.Option(None, help="Model name; default: the benchmark's."),
    gamma: float | None = typer.Option(
        None, help="FLOPs budget per task, in (0, 1]; ESPN default 0.2."
    ),
    alpha: float | None = typer.Option(
        None, help="Weight allocation in (0, 1]; default: the benchmark's."
    ),
    tasks: int | None = typer.Option(None, help="Number of tasks; default: the benchmark's."),
    train_per_task: int | None = typer.Option(
        None, help="Keep a seeded subset of N training images per task."
    ),
    test_per_task: int | None = typer.Option(
        None, help="Keep a seeded subset of N test images per task."
    ),
    epochs: str | None = typer.Option(None, help="PRE,PRUNE,FINE epochs per task, e.g. 3,4,3."),
    optimizer: str | None = typer.Option(
        None, help="sgd, adam or rmsprop; default: the benchmark's."
    ),
    lr: float | None = typer.Option(None, help="Learning rate; default: the benchmark's."),
    batch_size: int | None = typer.Option(None, help="Batch size; default: the benchmark's."),
    weight_decay: float = typer.Option(0.0, help="Weight decay (never reaches frozen weights)."),
    momentum: float = typer.Option(0.0, help="Momentum of SGD and RMSprop."),
    pruner: str = typer.Option(
        "flop-aware", help="Unit pruner: " + ", ".join(PRUNERS.names()) + "."
    ),
    penalty: float = typer.Option(1e-4, help="Strength of the pruner's sparsity penalty."),
    supsup_k: float | None = typer.Option(
        None, help="SupSup: fraction of each layer's weights in a supermask, in (0, 1]; 0.5."
    ),
    reuse: str = typer.Option(
        "magnitude", help="Frozen weights a task keeps: 'magnitude' or 'all'."
    ),
    eval_every: int = typer.Option(
        1,
        help="Evaluate all tasks so far after every K-th task and the last (accuracy-matrix "
        "rows; skipped rows are null).",
    ),
    seed: int = typer.Option(0, help="Seed of data order, permutations/rotations, init."),
    device: str = typer.Option("cpu", help="cpu, cuda or cuda:N."),
    data_dir: Path | None = typer.Option(
        None, help="Dataset root (default $ESPN_DATA or ~/.cache/espn/data)."
    ),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    quiet: bool = typer.Option(False, help="Print only the final summary."),
    resume: bool = typer.Option(
        False, help="Continue a killed run from OUT/checkpoint (same options required)."
    ),
    overwrite: bool = typer.Option(
        False, help="Start over in an OUT that holds an earlier run, replacing it."
    ),
    preset: str | None = typer.Option(
        None, help="Recipe (see `espn presets`) or a .json file; explicit options win over it."
    ),
    amp: bool = typer.Option(False, help="Mixed precision (float16 + loss scaling on CUDA)."),
    folders: str | None = typer.Option(
        None, help="image-folders: DIR1,DIR2,... one ImageFolder directory per task."
    ),
    image_size: int | None = typer.Option(
        None, help="image-folders: side of the square images (default 224)."
    ),
) -> None:
    """Learn a sequence of tasks into one supernet and report accuracy, FLOPs and weights."""
    from espn.experiment import run_experiment

    cfg = presets.make_config_given(
        ctx,
        benchmark=benchmark,
        method=method,
        model=model,
        gamma=gamma,
        alpha=alpha,
        tasks=tasks,
        train_per_task=train_per_task,
        test_per_task=test_per_task,
        epochs=parse_epochs(epochs),
        optimizer=optimizer,
        lr=lr,
        batch_size=batch_size,
        weight_decay=weight_decay,
        momentum=momentum,
        pruner=pruner,
        penalty=penalty,
        supsup_k=supsup_k,
        reuse=reuse,
        eval_every=eval_every,
        seed=seed,
        device=device,
        data_dir=data_dir,
        preset=preset,
        amp=amp,
        folders=presets.parse_folders(folders),
        image_size=image_size,
        out=out,
    )
    doc = run_experiment(
        cfg,
        progress=progress,
        on_task_end=None if quiet else lambda line: console.print(line),
        resume=resume,
        overwrite=overwrite,
    )
    ratios = doc["flops_ratio"]
    console.print(
        f"{doc['method']} on {doc['benchmark']} ({len(ratios)} tasks): "
        f"average accuracy {doc['average_accuracy']:.2f}%, "
        f"mean FLOPs ratio {sum(ratios) / len(ratios):.3f}, "
        f"max forgetting {max(doc['forgetting']):.2f} points, "
        f"storage {doc['storage_bytes'] / 2**20:.2f} MiB, "
        f"wall time {doc['wall_time_s']:.1f}s"
    )
    console.print(f"wrote {Path(out) / 'results.json'} and {Path(out) / 'accuracy.png'}")


@app.command("list")
def list_components() -> None:
    """List the benchmarks, models, methods and pruners espn knows by name."""
    table = Table("kind", "name", "description")
    for name in BENCHMARKS:
        b = BENCHMARKS.get(name)
        n = b.default_tasks
        table.add_row("benchmark", name, f"{b.description} ({n} task{'s' * (n != 1)} by default)")
    for name in MODELS:
        table.add_row("model", name, (MODELS.get(name).__doc__ or "").strip().splitlines()[0])
    for name in METHODS:
        table.add_row("method", name, (METHODS.get(name).__doc__ or "").strip().splitlines()[0])
    for name in PRUNERS:
        table.add_row("pruner", name, (PRUNERS.get(name).__doc__ or "").strip().splitlines()[0])
    console.print(table)


@app.command()
@user_errors
def show(run_dir: Path = typer.Argument(..., help="A run directory.")) -> None:
    """Print the accuracy matrix and per-task budgets of a finished run."""
    doc = json.loads((run_dir / "results.json").read_text())
    table = Table("task", "name", "final acc %", "FLOPs ratio", "new weights", "budget")
    for j, name in enumerate(doc["task_names"]):
        table.add_row(
            str(j + 1),
            name,
            f"{doc['final_accuracy'][j]:.2f}",
            f"{doc['flops_ratio'][j]:.3f}",
            str(doc["new_weights"][j]),
            str(doc["weight_budget"][j]),
        )
    console.print(table)
    console.print(f"average accuracy {doc['average_accuracy']:.2f}%")
    rows = doc["accuracy_matrix"]
    skipped = sum(row is None for row in rows)
    if skipped:
        console.print(
            f"accuracy matrix: {len(rows) - skipped} of {len(rows)} rows evaluated "
            f"(every {doc['config'].get('eval_every', 1)} tasks and the last); "
            "forgetting and BWT use those rows"
        )


def main() -> None:
    """Console entry point ``espn``."""
    app()


if __name__ == "__main__":
    main()
