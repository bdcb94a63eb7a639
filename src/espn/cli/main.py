"""``espn``: train, inspect and compare zero-forgetting continual learners. A command's module
is imported only when it runs (:class:`LazyCommands`) and torch only inside the commands that
need it, so ``espn --version``, ``--help`` and a mistyped command answer at once."""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table
from typer.core import TyperGroup

from espn.cli.options import flag, with_run_options
from espn.settings.training import DEFAULT_LOG_EVERY, MAX_COUNT, default
from espn.utils.commands import (
    RUN_ALIAS,
    RUN_ARGUMENT,
    RunInterrupted,
    command_group,
    console,
    fail,
    handle,
    run_directory,
    set_debug,
    user_errors,
    warn,
)
from espn.utils.text import printable

if TYPE_CHECKING:
    from espn.runs.config import RunConfig

#: every command: the module and attribute defining it (a command function or a typer app of
#: subcommands) and its line in ``espn --help`` (a test checks it against the command's own)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": (
        "espn.cli.main",
        "run",
        "Learn a sequence of tasks into one supernet and report accuracy, FLOPs and weights.",
    ),
    "list": (
        "espn.cli.main",
        "list_components",
        "List the benchmarks, models, methods and pruners espn knows by name.",
    ),
    "show": (
        "espn.cli.main",
        "show",
        "Print a run's per-task table (final accuracy, FLOPs ratio, new weights, budget) and "
        "its accuracy matrix (row t: accuracy of tasks 0..t after learning task t), from "
        "results.json.",
    ),
    "evaluate": (
        "espn.cli.deploy",
        "evaluate",
        "Re-compute each task's test accuracy from the checkpoint alone.",
    ),
    "export": (
        "espn.cli.deploy",
        "export_command",
        "Write one task as a slim standalone model (.pt2 / .onnx), or with --task-agnostic "
        "one model that predicts without the task.",
    ),
    "info": (
        "espn.cli.deploy",
        "info",
        "Print per-task FLOPs, weights and storage, and the checkpoint's size.",
    ),
    "sweep": (
        "espn.cli.sweep",
        "sweep",
        "Run every point of a grid of `espn run` options (reusing finished points, resuming "
        "killed ones); one point's failure does not stop the others.",
    ),
    "presets": (
        "espn.cli.presets",
        "app",
        "Named run recipes for `espn run --preset NAME` (options given explicitly win).",
    ),
    "reproduce": (
        "espn.reproduce.cli",
        "app",
        "Reproduce the paper's tables and figures: espn reproduce TARGET --scale "
        "{smoke,cpu,paper} --out DIR; `espn reproduce list` names the targets.",
    ),
    "theory": (
        "espn.theory.cli",
        "app",
        "Theory lab: the paper's shallow-network model of continual representation learning "
        "(planted model, CRL solver, sample complexity, mismatch, task order).",
    ),
}


def load_command(name: str) -> Any:
    """Command ``name`` of :data:`COMMANDS` as a click command, its module imported now."""
    module, attr, _ = COMMANDS[name]
    found = getattr(importlib.import_module(module), attr)
    if isinstance(found, typer.Typer):
        command = typer.main.get_command(found)
    else:
        one = command_group()
        one.command(name)(with_run_options(found) if name == "run" else found)
        command = typer.main.get_command(one)
    command.name = name
    return command


def _shortened(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word, with ``...`` when cut."""
    return text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + "..."


class LazyCommands(TyperGroup):
    """The ``espn`` group: a command is built (its module imported) only when it runs or
    its own help is asked for; ``espn --help`` lists them from :data:`COMMANDS`."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(dict.fromkeys([*COMMANDS, *self.commands]))

    def get_command(self, ctx: Any, name: str) -> Any:
        if name not in self.commands and name in COMMANDS:
            self.commands[name] = load_command(name)
        return self.commands.get(name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        rows = [(name, _shortened(text, limit)) for name, (_, _, text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = command_group(
    cls=LazyCommands,
    help="Efficient Sparse PackNet: zero-forgetting, inference-efficient continual learning.",
    no_args_is_help=True,
)


def print_version(value: bool) -> None:
    """``espn --version``: print the package version and exit before any command runs."""
    if value:
        from espn import __version__

        console.print(f"espn {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    debug: bool = typer.Option(
        False, "--debug", help="On an error, show the Python traceback (or set ESPN_DEBUG=1)."
    ),
    version: bool = typer.Option(
        False,
        "--version",
        callback=print_version,
        is_eager=True,
        help="Print espn's version and exit.",
    ),
) -> None:
    """Efficient Sparse PackNet: zero-forgetting, inference-efficient continual learning."""
    set_debug(debug)


def resume_command(ctx: typer.Context) -> str:
    """The ``espn run`` command line that continues this run (``--overwrite`` dropped)."""
    words = ["espn", "run"]
    for param in ctx.command.params:
        name, value = param.name or "", ctx.params.get(param.name or "")
        source = ctx.get_parameter_source(name)
        if name in ("resume", "overwrite") or source is None or source.name != "COMMANDLINE":
            continue
        if isinstance(value, bool):
            words.append(flag(name) if value else "--no-" + flag(name)[2:])
        else:
            words += [flag(name), shlex.quote(str(value))]
    return " ".join([*words, "--resume"])


def interrupted_message(out: Path, ctx: typer.Context) -> str:
    """What Ctrl-C leaves behind: where the last checkpoint is and how to continue."""
    from espn.checkpoint.format import checkpoint_dir, manifest_or_none

    doc = manifest_or_none(checkpoint_dir(out))
    if doc is None:
        return "interrupted before the first checkpoint was written; nothing to resume"
    where = (
        f"the last checkpoint ({len(doc['tasks'])} task(s) finished) is in {checkpoint_dir(out)}"
    )
    return f"interrupted; {where}; continue with: {resume_command(ctx)}"


def run(
    ctx: typer.Context,
    progress: bool = typer.Option(
        True,
        help="Show each task's training on stderr: its steps, estimated time and end, and a "
        "progress bar on a terminal (plain lines every 30 s elsewhere).",
    ),
    quiet: bool = typer.Option(False, help="Print only the final summary (no progress)."),
    resume: bool = typer.Option(
        False, help="Continue a killed run from OUT/checkpoint (same options required)."
    ),
    overwrite: bool = typer.Option(
        False, help="Start over in an OUT that holds an earlier run, replacing it."
    ),
    log: str | None = typer.Option(
        None, help="Experiment loggers, comma-separated: tensorboard, csv, wandb (in OUT/logs)."
    ),
    log_every: int | None = typer.Option(
        None,
        min=1,
        max=MAX_COUNT,
        help=f"The loggers of --log record the loss every N steps ({DEFAULT_LOG_EVERY} unless "
        "given; only with --log).",
    ),
    distributed: bool = typer.Option(
        True, help="Under torchrun, train data-parallel over its processes (rank 0 writes OUT)."
    ),
    **options: Any,
) -> None:
    """Learn a sequence of tasks into one supernet and report accuracy, FLOPs and weights."""
    if log_every is not None and not (log or "").strip():
        fail("--log-every sets how often the loggers of --log read the loss; add --log or drop it")
    try:
        cfg = _config(ctx, options)
        from espn.api.experiment import run_experiment  # imports torch: after the checks
        from espn.runs.preflight import run_warnings
        from espn.training.distributed import writes_files

        for note in run_warnings(cfg):
            warn(note)
        echo = None if quiet else lambda line: console.print(printable(line), soft_wrap=True)
        try:
            doc = run_experiment(
                cfg,
                progress=progress and not quiet,
                on_task_end=echo,  # printable: task names come from the data
                resume=resume,
                overwrite=overwrite,
                on_warning=warn,
                loggers=[name.strip() for name in (log or "").split(",") if name.strip()],
                log_every=log_every,
                distributed=distributed,
            )
        except KeyboardInterrupt:
            raise RunInterrupted(interrupted_message(cfg.out, ctx)) from None
        if writes_files():  # a data-parallel rank other than 0: rank 0 reports
            _report(doc, cfg.out, cfg.device if cfg.task_agnostic else None)
    except BaseException as exc:  # the one error handler (see :func:`user_errors`)
        handle(exc)


def _config(ctx: typer.Context, options: dict[str, Any]) -> RunConfig:
    """The run's configuration from the ``options`` given (:mod:`espn.cli.options`); those
    left at their default are dropped, for a preset and the recipes to fill in."""
    from espn.runs.config import make_config  # imports pydantic: once the command runs
    from espn.runs.given import check_applicable

    defaulted = ("DEFAULT", "DEFAULT_MAP")  # typer may vendor click: compare by name
    source = ctx.get_parameter_source
    given = {k: v for k, v in options.items() if getattr(source(k), "name", None) not in defaulted}
    cfg = make_config(**given)
    check_applicable(set(given), cfg)
    return cfg


def _report(doc: dict[str, Any], out: Path, agnostic_device: str | None) -> None:
    """The summary of a run just finished, and for a run prepared for it (``agnostic_device``
    not None) ``espn evaluate OUT --task-agnostic --rule all`` on that device."""
    ratios = doc["flops_ratio"]
    console.print(
        f"{doc['method']} on {doc['benchmark']} ({len(ratios)} tasks): "
        f"average accuracy {doc['average_accuracy']:.2f}%, "
        f"mean FLOPs ratio {sum(ratios) / len(ratios):.3f}, "
        f"max forgetting {max(doc['forgetting']):.2f} points, "
        f"storage {doc['storage_bytes'] / 2**20:.2f} MiB, "
        f"wall time {doc['wall_time_s']:.1f}s",
        soft_wrap=True,
    )
    console.print(f"wrote {out / 'results.json'} and {out / 'accuracy.png'}")
    if agnostic_device is None:
        return
    from espn.api.functions import load
    from espn.cli import deploy

    learner = load(out, device=agnostic_device, benchmark_data=True)
    tasks = [task for task in learner.tasks if task is not None]
    deploy.task_agnostic_report(out, learner.supernet, tasks, "all")


@user_errors
def list_components() -> None:
    """List the benchmarks, models, methods and pruners espn knows by name."""
    from espn.data.registry import BENCHMARKS
    from espn.methods.base import METHODS
    from espn.models.registry import MODELS
    from espn.pruning.pruner import PRUNERS

    table = Table("kind", "name", "description")
    for name in BENCHMARKS:
        b = BENCHMARKS.get(name)
        n = b.default_tasks
        model = b.defaults.get("model")
        default = f"model {model}" if model else "no default model: give --model"
        table.add_row(
            "benchmark",
            name,
            f"{b.description} ({n} task{'s' * (n != 1)} and {default} by default)",
        )
    for kind, registry in (("model", MODELS), ("method", METHODS), ("pruner", PRUNERS)):
        for name in registry:
            table.add_row(kind, name, _summary(registry.get(name)))
    console.print(table)


def _summary(obj: object) -> str:
    """The first line of ``obj``'s docstring ("" for none: a model registered by reference)."""
    lines = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    return lines[0] if lines else ""


@user_errors
def show(run_dir: Path | None = RUN_ARGUMENT, run_alias: Path | None = RUN_ALIAS) -> None:
    """Print a run's per-task table (final accuracy, FLOPs ratio, new weights, budget) and its
    accuracy matrix (row t: accuracy of tasks 0..t after learning task t), from results.json."""
    run = run_directory(run_dir, run_alias)
    if not (run / "results.json").is_file():  # before torch is imported: a quick refusal
        fail(f"no results.json in {run} (is it the --out of an `espn run`?)")
    from espn.evaluation.results import read_results  # imports torch: after the checks

    doc = read_results(run)
    assert doc is not None
    table = Table("task", "name", "final acc %", "FLOPs ratio", "new weights", "budget")
    final = doc["final_accuracy"] or [None] * len(doc["task_names"])  # no test data: none
    for j, name in enumerate(doc["task_names"]):
        table.add_row(
            str(j),
            printable(name),
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
    _show_task_agnostic(doc)
    rows = doc["accuracy_matrix"]
    console.print(accuracy_matrix_table(rows))
    skipped = sum(row is None for row in rows)
    if skipped:
        console.print(
            f"accuracy matrix: {len(rows) - skipped} of {len(rows)} rows evaluated "
            f"(every {printable(doc['config'].get('eval_every', default('eval_every')))} tasks and the last); "
            "forgetting and BWT use those rows"
        )


def accuracy_matrix_table(rows: list[list[float] | None]) -> Table:
    """The accuracy matrix as a table: one row per task learned ("after task t"), one column
    per task (accuracy %, 0-based); rows not evaluated (``--eval-every``) say so."""
    n = len(rows)
    table = Table(
        "after task",
        *(str(j) for j in range(n)),
        title="accuracy matrix (%), tasks 0.." + str(n - 1),
    )
    for t, row in enumerate(rows):
        cells = ["not evaluated"] if row is None else [f"{v:.2f}" for v in row]
        table.add_row(str(t), *cells, *[""] * (n - len(cells)))
    return table


def _show_task_agnostic(doc: dict[str, Any]) -> None:
    """The figures ``espn evaluate --task-agnostic`` stored, one table per rule."""
    from espn.cli import deploy
    from espn.inference.report import stored

    for entry in stored(doc).values():
        console.print(deploy.agnostic_table(entry, doc["task_names"]))
        console.print(
            f"inference FLOPs per sample: {entry['flops_passes']:.2f} dense passes; "
            f"task picked right per batch of {entry['batch']}: "
            f"{entry['average']['task_picked_per_batch']:.2f}%"
        )


def main() -> None:
    """Console entry point ``espn``."""
    app()


if __name__ == "__main__":
    main()
