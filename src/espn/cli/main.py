"""``espn``: train, inspect and compare zero-forgetting continual learners."""

from __future__ import annotations

import functools
import inspect
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from espn.cli import deploy, presets, reproduce, study, sweep, theory
from espn.cli.common import (
    RunInterrupted,
    err_console,
    fail,
    parse_epochs,
    run_dir_option,
    set_debug,
    user_errors,
)
from espn.data.registry import BENCHMARKS
from espn.methods.base import METHODS, declared_options
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
app.add_typer(reproduce.app, name="reproduce")  # reproduce TARGET|list|report
app.add_typer(theory.app, name="theory")  # theory sample-complexity, mismatch, task-order, report
app.command("sweep")(sweep.sweep)  # sweep SPEC --out DIR


@app.callback()
def root(
    debug: bool = typer.Option(
        False, "--debug", help="On an error, show the Python traceback (or set ESPN_DEBUG=1)."
    ),
) -> None:
    """Efficient Sparse PackNet: zero-forgetting, inference-efficient continual learning."""
    set_debug(debug)


def resume_command(ctx: typer.Context) -> str:
    """The ``espn run`` command line that continues this run: its explicit options and
    ``--resume`` (``--overwrite`` dropped)."""
    words = ["espn", "run"]
    for param in ctx.command.params:
        name, value = param.name or "", ctx.params.get(param.name or "")
        source = ctx.get_parameter_source(name)
        if name in ("resume", "overwrite") or source is None or source.name != "COMMANDLINE":
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            words += [flag, shlex.quote(str(value))]
    return " ".join([*words, "--resume"])


def interrupted_message(out: Path, ctx: typer.Context) -> str:
    """What Ctrl-C leaves behind: where the last checkpoint is and how to continue."""
    manifest = out / "checkpoint" / "manifest.json"
    try:
        doc: dict[str, Any] = json.loads(manifest.read_text())
        done = len(doc["tasks"])
        where = f"the last checkpoint ({done} task(s) finished) is in {manifest.parent}"
    except (OSError, ValueError, KeyError, TypeError):
        return "interrupted before the first checkpoint was written; nothing to resume"
    return f"interrupted; {where}; continue with: {resume_command(ctx)}"


#: where ``espn run --help`` lists the flags the methods declare for themselves
METHOD_OPTIONS_PANEL = "Method options"


def method_option_parameters() -> list[inspect.Parameter]:
    """One keyword parameter (a typer option, None when not given) per option that the
    registered methods declare (``Strategy.options``)."""
    params = []
    for name, (option, methods) in declared_options().items():
        decls = [option.flag]
        if option.type is bool:
            decls = [f"{option.flag}/--no-{option.flag[2:]}"]
        text = (
            f"{', '.join(methods)}: {option.help}, {option.accepted()}; default {option.default}."
        )
        info = typer.Option(None, *decls, help=text, rich_help_panel=METHOD_OPTIONS_PANEL)
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=option.type | None
            )
        )
    return params


class WithMethodOptions:
    """A command callback whose signature, as typer reads it, is ``fn``'s own parameters plus
    :func:`method_option_parameters`.

    typer builds the click command from the callback's signature each time the CLI runs, so
    the flags follow the methods registered at that time (a method added by a plugin or a
    test has its flags without any change here); their values reach ``fn``'s ``**kwargs``.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn

    @property
    def __signature__(self) -> inspect.Signature:
        own = inspect.signature(self._fn)
        fixed = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
        return own.replace(parameters=[*fixed, *method_option_parameters()])

    def __call__(self, **kwargs: Any) -> Any:
        return self._fn(**kwargs)


@app.command()
@WithMethodOptions
@user_errors
def run(
    ctx: typer.Context,
    benchmark: str | None = typer.Option(
        None, help="Benchmark name (see `espn list`); required unless the preset sets one."
    ),
    method: str = typer.Option("espn", help="Method: " + ", ".join(METHODS.names()) + "."),
    out: Path = typer.Option(
        ...,
        parser=run_dir_option,
        help="Run directory for results.json, accuracy.png and checkpoint/.",
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
        None,
        help="sgd, nesterov, adam or rmsprop; default: the method's recipe, else the benchmark's.",
    ),
    lr: float | None = typer.Option(None, help="Learning rate; default: the benchmark's."),
    batch_size: int | None = typer.Option(None, help="Batch size; default: the benchmark's."),
    weight_decay: float | None = typer.Option(
        None, help="Weight decay (never reaches frozen weights); default: the method's recipe."
    ),
    momentum: float | None = typer.Option(
        None, help="Momentum of SGD and RMSprop; default: the method's recipe."
    ),
    task_affine: bool = typer.Option(
        False,
        "--task-affine",
        help="Beyond the paper: per-task unit scale and shift (FC gates, BatchNorm affine for "
        "every method) and a per-task bias on a shared head.",
    ),
    warmup: int | None = typer.Option(
        None, help="Warm-up epochs (free weights only, lr ramp), taken from pre-training."
    ),
    finetune_lr: float | None = typer.Option(
        None, help="Fine-tuning learning rate; default: the benchmark's (MNIST 1e-4)."
    ),
    finetune_schedule: str | None = typer.Option(
        None, help="Fine-tuning schedule: 'cosine' or 'constant'; default: the benchmark's."
    ),
    seed: int = typer.Option(0, help="Seed of initialisation, batch order and augmentation."),
    task_seed: int | None = typer.Option(
        None,
        help="Seed of the task sequence (permutations, rotation/class order, subsets); "
        "default: --seed.",
    ),
    class_order: str | None = typer.Option(
        None, help="Split benchmarks: 'random' (from the task seed) or 'superclass' (CIFAR-100)."
    ),
    init_weights: Path | None = typer.Option(
        None,
        help="Adopt task 0 from pretrained weights (.safetensors or .pt state dict): its "
        "non-zero weights are frozen as the first task.",
    ),
    eval_every: int = typer.Option(
        1,
        help="Evaluate all tasks so far after every K-th task and the last (accuracy-matrix "
        "rows; skipped rows are null).",
    ),
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
    train_sizes: str | None = typer.Option(
        None,
        help="Training images per task, in the given task order: N1,N2,... (one per task) "
        "or geometric:N1:N2 (N1 for the first task, N2 for the last); overrides "
        "--train-per-task.",
    ),
    task_order: str = typer.Option(
        "given",
        help="Order the tasks are learned in: given, random (from the task seed), "
        "large-first, small-first (training-set size) or diverse (most diverse first).",
    ),
    from_run: Path | None = typer.Option(
        None,
        help="Learn this run's tasks on top of the supernet of the finished run DIR as it "
        "was after its first --after-task tasks (DIR is only read).",
    ),
    after_task: int | None = typer.Option(
        None, help="With --from-run: how many of its tasks to keep (K >= 1)."
    ),
    step_floor: bool = typer.Option(
        True,
        help="Size rule: a task smaller than the reference size trains each phase for as many "
        "optimizer steps as its epochs take on the reference size; off: epochs as given.",
    ),
    reference_size: int | None = typer.Option(
        None,
        help="Training images per task the epochs are stated for (size rule); default: the "
        "benchmark's (MNIST 60000, SplitCIFAR 2500) unless --epochs is given.",
    ),
    **method_options: Any,
) -> None:
    """Learn a sequence of tasks into one supernet and report accuracy, FLOPs and weights.

    Each method's own options (e.g. ``--supsup-k``) come from its declaration (see
    :class:`WithMethodOptions`) and arrive in ``method_options``.
    """
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
        task_affine=task_affine,
        warmup=warmup,
        finetune_lr=finetune_lr,
        finetune_schedule=finetune_schedule,
        eval_every=eval_every,
        seed=seed,
        task_seed=task_seed,
        class_order=class_order,
        init_weights=init_weights,
        device=device,
        data_dir=data_dir,
        preset=preset,
        amp=amp,
        folders=presets.parse_folders(folders),
        image_size=image_size,
        train_sizes=train_sizes,
        task_order=task_order,
        from_run=from_run,
        after_task=after_task,
        step_floor=step_floor,
        reference_size=reference_size,
        out=out,
        **method_options,
    )
    try:
        doc = run_experiment(
            cfg,
            progress=progress,
            on_task_end=None if quiet else lambda line: console.print(line),
            resume=resume,
            overwrite=overwrite,
            on_warning=lambda line: err_console.print(
                f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True
            ),
        )
    except KeyboardInterrupt:
        raise RunInterrupted(interrupted_message(Path(out), ctx)) from None
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
@user_errors
def list_components() -> None:
    """List the benchmarks, models, methods and pruners espn knows by name."""
    table = Table("kind", "name", "description")
    for name in BENCHMARKS:
        b = BENCHMARKS.get(name)
        n = b.default_tasks
        table.add_row("benchmark", name, f"{b.description} ({n} task{'s' * (n != 1)} by default)")
    for kind, registry in (("model", MODELS), ("method", METHODS), ("pruner", PRUNERS)):
        for name in registry:
            table.add_row(kind, name, _summary(registry.get(name)))
    console.print(table)


def _summary(obj: object) -> str:
    """The first line of ``obj``'s docstring ("" for none: a model registered by reference)."""
    lines = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    return lines[0] if lines else ""


@app.command()
@user_errors
def show(run_dir: Path = typer.Argument(..., help="A run directory.")) -> None:
    """Print the accuracy matrix and per-task budgets of a finished run."""
    from espn.evaluation.results import read_results

    doc = read_results(run_dir)
    if doc is None:
        fail(f"no results.json in {run_dir} (is it the --out of an `espn run`?)")
        return
    table = Table("task", "name", "final acc %", "FLOPs ratio", "new weights", "budget")
    final = doc["final_accuracy"] or [None] * len(doc["task_names"])  # no test data: none
    for j, name in enumerate(doc["task_names"]):
        table.add_row(
            str(j + 1),
            name,
            "-" if final[j] is None else f"{final[j]:.2f}",
            f"{doc['flops_ratio'][j]:.3f}",
            str(doc["new_weights"][j]),
            str(doc["weight_budget"][j]),
        )
    console.print(table)
    if doc["average_accuracy"] is None:
        console.print("no accuracy recorded (the tasks were learned without test data)")
        return
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
