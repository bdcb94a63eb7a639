"""``espn theory ...``: each experiment writes ``<name>.csv`` (one row per solve), ``.png`` and
``_summary.json`` into ``--out`` and prints the summary computed from the CSV; ``espn theory
report CSV`` recomputes them from a CSV alone (docs/theory.md)."""

from __future__ import annotations

import importlib
import inspect
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar, cast, get_type_hints

import typer

from espn.theory.config import (
    ACTIVATIONS,
    COLUMNS,
    INPUT_DISTRIBUTIONS,
    TASK_ORDERS,
    MismatchConfig,
    SampleComplexityConfig,
    TaskOrderConfig,
    TheoryConfigError,
)
from espn.theory.report import read_rows
from espn.utils.commands import command_group, user_errors
from espn.utils.io import read_json, write_csv, write_json_atomic

app = command_group(
    help="Theory lab: the paper's shallow-network model of continual representation "
    "learning (planted model, CRL solver, sample complexity, mismatch, task order). "
    "CPU only, minutes at default sizes.",
    no_args_is_help=True,
)

T = TypeVar("T", int, float, str)
KEYWORD = inspect.Parameter.KEYWORD_ONLY
Experiment = SampleComplexityConfig | MismatchConfig | TaskOrderConfig

#: the command-line help of every setting (:mod:`espn.theory.config`), the same in each
#: command but where an experiment gives its own (:data:`OWN_HELP`)
HELP = {
    "d": "Input dimension d.",
    "r": "Representation dimension r (rows of W*).",
    "tasks": "Number of tasks T.",
    "activation": f"Activation psi: {', '.join(ACTIVATIONS)}.",
    "noise": "Z ~ Uniform[-noise, noise]; E[Z^2] = noise^2/3.",
    "head_norm": "Norm of every planted head v_t.",
    "inputs": f"Input distribution (radius sqrt(d)): {', '.join(INPUT_DISTRIBUTIONS)}.",
    "replicates": "Independent planted models (curves are means).",
    "n_test": "Test samples per task.",
    "restarts": "Solver initialisations (the best one is kept).",
    "max_iter": "L-BFGS iterations per solve.",
    "bound_slack": "Norm bounds B_v, B_W = slack x the planted norms.",
    "seed": "Seed of every random draw.",
    "threads": "Torch CPU threads (0: torch's default).",
    "ns": "Samples per task N (comma-separated, >= 1).",
    "target": "Excess risk at which N*T is compared.",
    "r_new": "New rows learned (default r - r_frz; fewer gives a partial representation).",
    "perturbations": "Perturbation sizes eps of W_frz (comma-separated, >= 0): row + eps * "
    "orthogonal.",
    "mm_n": "Noise-free samples per task of the MM solve.",
    "include_scratch": "Also run learning from scratch for reference.",
    "heads": "Heads (outputs) per task, like classes per task.",
    "n_max": "Samples per head of task ID 1 (the largest).",
    "n_min": "Samples per head of the last task ID (the smallest).",
    "first_rows": "Rows the first arrival adds (default r).",
    "rows_per_task": "Rows every later arrival adds (>= 0).",
    "orders": f"Orders to run: {', '.join(TASK_ORDERS)}.",
}
OWN_HELP = {
    "sample_complexity": {
        "r_frz": "Frozen rows r_frz (comma-separated, each in [0, r]); scratch is always run."
    },
    "mismatch": {"r_frz": "Frozen rows r_frz, in [0, r]."},
    "task_order": {"tasks": "Number of tasks (arrivals).", "n_test": "Test samples per head."},
}
#: library parameters whose option is not named after them
OPTION_NAMES = {"include_scratch": "--scratch"}


def option_name(parameter: str) -> str:
    """The command-line option of a library parameter (``r_frz`` -> ``--r-frz``; several
    joined by ``/``)."""
    return "/".join(OPTION_NAMES.get(p, "--" + p.replace("_", "-")) for p in parameter.split("/"))


def parse_list(option: str, text: str, kind: type[T]) -> tuple[T, ...]:
    """``"4,8,16"`` -> (4, 8, 16) (``kind`` int, float or str), or a clear error naming
    ``option``."""
    try:
        values = tuple(kind(v.strip()) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values:
        what = {int: "integers", float: "numbers"}.get(kind, "names")
        raise TheoryConfigError(f"{option}: expected comma-separated {what}, got {text!r}")
    return values


def _report(csv_path: Path, config: dict[str, Any] | None = None) -> None:
    """Summarise and plot a theory CSV (its experiment told by its columns); ``config`` None:
    the one stored beside it. The experiment's code is ``run_<kind>`` and ``summarize_<kind>``
    of ``espn.theory.<kind>``, its text table ``report.format_<kind>``, its figure
    ``plots.plot_<kind>``."""
    from espn.theory import plots, report

    kind, rows = read_rows(csv_path)
    stem = csv_path.with_suffix("")
    summary_path = stem.parent / f"{stem.name}_summary.json"
    if config is None:
        try:
            config = read_json(summary_path).get("config")
        except (OSError, ValueError):
            config = None
    summarize = getattr(importlib.import_module(f"espn.theory.{kind}"), f"summarize_{kind}")
    if kind == "sample_complexity":
        summary = summarize(rows, float((config or {}).get("target", 0.01)))
    else:
        summary = summarize(rows)
    getattr(plots, f"plot_{kind}")(rows, summary, stem.with_suffix(".png"))
    write_json_atomic(summary_path, {"config": config, "summary": summary})
    typer.echo(getattr(report, f"format_{kind}")(summary))
    typer.echo(f"wrote {csv_path}, {stem.with_suffix('.png')} and {summary_path}")


def _experiment(name: str, cls: type[Experiment], options: dict[str, Any]) -> None:
    """Experiment ``name``: its ``cls`` from a command's options (a list parsed from its
    comma-separated text), validated first (its error naming the option where the library
    names its parameter); its ``run_<name>(cfg, progress)`` under a progress bar of
    ``cfg.solves()`` solves unless ``--no-progress``; the CSV written, then summarised and
    plotted from the CSV as read back."""
    settings, hints = {}, get_type_hints(cls)
    for f in fields(cls):
        value = options[f.name]
        if typing.get_origin(hints[f.name]) is tuple:
            value = parse_list(option_name(f.name), value, typing.get_args(hints[f.name])[0])
        settings[f.name] = value
    cfg = cls(**settings)
    try:
        cfg.validate()
    except TheoryConfigError as exc:
        if exc.parameter is None:
            raise
        raise TheoryConfigError(exc.reason, option_name(exc.parameter)) from None
    run = getattr(importlib.import_module(f"espn.theory.{name}"), f"run_{name}")
    if options["progress"]:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=True,
        ) as bar:
            task = bar.add_task(name.replace("_", " "), total=cfg.solves())
            rows = run(cfg, lambda k: bar.advance(task, k))
    else:
        rows = run(cfg, None)
    _report(write_csv(options["out"] / f"{name}.csv", rows, COLUMNS[name]), cfg.as_dict())


def _parameters(name: str, cls: type[Experiment]) -> list[inspect.Parameter]:
    """The options of experiment ``name``: ``--out``, one per setting of ``cls`` (a list as
    comma-separated text) and ``--progress``."""
    out = typer.Option(..., help=f"Output directory for {name}.csv/.png.")
    params = [inspect.Parameter("out", KEYWORD, default=out, annotation=Path)]
    hints = get_type_hints(cls)
    for f in fields(cls):
        kind, default = hints[f.name], cast(Any, f.default)
        flag = option_name(f.name)
        if kind is bool:
            flag = f"{flag}/--no-{flag[2:]}"
        if typing.get_origin(kind) is tuple:  # comma-separated text
            kind = str
            default = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default)
        text = OWN_HELP[name].get(f.name) or HELP[f.name]
        option = typer.Option(default, flag, help=text)
        params.append(inspect.Parameter(f.name, KEYWORD, default=option, annotation=kind))
    progress = typer.Option(True, "--progress/--no-progress", help="Show a progress bar.")
    return [*params, inspect.Parameter("progress", KEYWORD, default=progress, annotation=bool)]


def _command(name: str, cls: type[Experiment], text: str) -> None:
    """The command of experiment ``name`` (dashed), its options :func:`_parameters`, its
    help ``text``."""

    def command(**options: Any) -> None:
        _experiment(name, cls, options)

    command.__signature__ = inspect.Signature(_parameters(name, cls))  # type: ignore[attr-defined]
    command.__doc__ = text
    app.command(name.replace("_", "-"))(user_errors(command))


_command(
    "sample_complexity",
    SampleComplexityConfig,
    """Excess risk vs N*T: frozen features (each r_frz) against learning from scratch.

    Prints the N*T needed to reach --target per setting next to the bound's
    prediction (proportional to dof = T*r + r_new*d).
    """,
)
_command(
    "mismatch",
    MismatchConfig,
    """Risk vs N*T on a perturbed W_frz: it levels off at the mismatch MM.

    MM = L*_frz - L* is measured separately by a large noise-free solve; the summary
    puts it next to the floor the risk curves reach.
    """,
)
_command(
    "task_order",
    TaskOrderConfig,
    """Sequential CRL: large tasks first vs small tasks first vs individual.

    Sample sizes fall as floor(n_max * (n_min/n_max)^((ID-1)/(tasks-1))), as in the
    paper's figure on sample size.
    """,
)


@app.command()
@user_errors
def report(
    csv_file: Path = typer.Argument(..., help="A CSV written by one of the theory commands."),
) -> None:
    """Recompute the summary and the figure of an experiment from its CSV alone."""
    if not csv_file.is_file():
        raise TheoryConfigError(f"CSV: no such file {csv_file}")
    _report(csv_file)
