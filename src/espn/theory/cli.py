"""``espn theory ...``: the paper's shallow-network theory as runnable CPU experiments.

Each command writes ``<name>.csv`` (one row per solve), ``<name>.png`` and
``<name>_summary.json`` into ``--out`` (all atomically), and prints a summary that is
computed from the CSV.  ``espn theory report CSV`` recomputes it (and the figure)
from a CSV alone.
"""

from __future__ import annotations

import importlib
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, TypeVar

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

N = TypeVar("N", int, float)


def parse_numbers(option: str, text: str, kind: type[N] = int) -> tuple[N, ...]:
    """``"4,8,16"`` -> (4, 8, 16) (``kind`` int or float), or a clear error naming ``option``."""
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values:
        what = "integers" if kind is int else "numbers"
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


# Options every experiment shares, declared once; each command gives its own defaults.
D = Annotated[int, typer.Option(help="Input dimension d.")]
R = Annotated[int, typer.Option(help="Representation dimension r (rows of W*).")]
Ns = Annotated[str, typer.Option(help="Samples per task N (comma-separated, >= 1).")]
Activation = Annotated[str, typer.Option(help=f"Activation psi: {', '.join(ACTIVATIONS)}.")]
Noise = Annotated[float, typer.Option(help="Z ~ Uniform[-noise, noise]; E[Z^2] = noise^2/3.")]
HeadNorm = Annotated[float, typer.Option(help="Norm of every planted head v_t.")]
Inputs = Annotated[
    str,
    typer.Option(help=f"Input distribution (radius sqrt(d)): {', '.join(INPUT_DISTRIBUTIONS)}."),
]
Replicates = Annotated[int, typer.Option(help="Independent planted models (curves are means).")]
Restarts = Annotated[int, typer.Option(help="Solver initialisations (the best one is kept).")]
MaxIter = Annotated[int, typer.Option(help="L-BFGS iterations per solve.")]
BoundSlack = Annotated[
    float, typer.Option(help="Norm bounds B_v, B_W = slack x the planted norms.")
]
Seed = Annotated[int, typer.Option(help="Seed of every random draw.")]
Threads = Annotated[int, typer.Option(help="Torch CPU threads (0: torch's default).")]
ShowProgress = Annotated[
    bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")
]


#: library parameters whose option is not named after them
OPTION_NAMES = {"include_scratch": "--scratch"}


def option_name(parameter: str) -> str:
    """The command-line option of a library parameter (``r_frz`` -> ``--r-frz``; several
    joined by ``/``)."""
    return "/".join(OPTION_NAMES.get(p, "--" + p.replace("_", "-")) for p in parameter.split("/"))


def _experiment(
    name: str,
    cls: type[SampleComplexityConfig | MismatchConfig | TaskOrderConfig],
    options: dict[str, Any],
    **parsed: Any,
) -> None:
    """Experiment ``name``: its ``cls`` from a command's options (those that are fields of
    ``cls``) and the values parsed from text, validated first (its error naming the option
    where the library names its parameter); its ``run_<name>(cfg, progress)`` under a
    progress bar of ``cfg.solves()`` solves unless ``--no-progress``; the CSV written, then
    summarised and plotted from the CSV as read back."""
    names = {f.name for f in fields(cls)}
    cfg = cls(**{k: v for k, v in options.items() if k in names and k not in parsed}, **parsed)
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


@app.command("sample-complexity")
@user_errors
def sample_complexity(
    out: Annotated[Path, typer.Option(help="Output directory for sample_complexity.csv/.png.")],
    d: D = 40,
    r: R = 8,
    tasks: Annotated[int, typer.Option(help="Number of tasks T.")] = 8,
    r_frz: Annotated[
        str,
        typer.Option(
            help="Frozen rows r_frz (comma-separated, each in [0, r]); scratch is always run."
        ),
    ] = "4,7",
    ns: Ns = "4,8,16,32,64,128,256,512,1024",
    activation: Activation = "identity",
    noise: Noise = 0.5,
    head_norm: HeadNorm = 2.5,
    inputs: Inputs = "sphere",
    replicates: Replicates = 3,
    n_test: Annotated[int, typer.Option(help="Test samples per task.")] = 2000,
    restarts: Restarts = 3,
    max_iter: MaxIter = 300,
    bound_slack: BoundSlack = 1.5,
    target: Annotated[float, typer.Option(help="Excess risk at which N*T is compared.")] = 0.01,
    seed: Seed = 0,
    threads: Threads = 1,
    progress: ShowProgress = True,
) -> None:
    """Excess risk vs N*T: frozen features (each r_frz) against learning from scratch.

    Prints the N*T needed to reach --target per setting next to the bound's
    prediction (proportional to dof = T*r + r_new*d).
    """
    _experiment(
        "sample_complexity",
        SampleComplexityConfig,
        locals(),
        r_frz=parse_numbers("--r-frz", r_frz),
        ns=parse_numbers("--ns", ns),
    )


@app.command()
@user_errors
def mismatch(
    out: Annotated[Path, typer.Option(help="Output directory for mismatch.csv/.png.")],
    d: D = 40,
    r: R = 8,
    tasks: Annotated[int, typer.Option(help="Number of tasks T.")] = 8,
    r_frz: Annotated[int, typer.Option(help="Frozen rows r_frz, in [0, r].")] = 6,
    r_new: Annotated[
        int | None,
        typer.Option(
            help="New rows learned (default r - r_frz; fewer gives a partial representation)."
        ),
    ] = None,
    perturbations: Annotated[
        str,
        typer.Option(
            help="Perturbation sizes eps of W_frz (comma-separated, >= 0): row + eps * orthogonal."
        ),
    ] = "0,0.1,0.25,0.5",
    ns: Ns = "8,16,32,64,128,256,512,1024,2048",
    mm_n: Annotated[int, typer.Option(help="Noise-free samples per task of the MM solve.")] = 2000,
    scratch: Annotated[
        bool, typer.Option(help="Also run learning from scratch for reference.")
    ] = True,
    activation: Activation = "identity",
    noise: Noise = 0.5,
    head_norm: HeadNorm = 2.5,
    inputs: Inputs = "sphere",
    replicates: Replicates = 3,
    n_test: Annotated[int, typer.Option(help="Test samples per task.")] = 2000,
    restarts: Restarts = 3,
    max_iter: MaxIter = 300,
    bound_slack: BoundSlack = 1.5,
    seed: Seed = 0,
    threads: Threads = 1,
    progress: ShowProgress = True,
) -> None:
    """Risk vs N*T on a perturbed W_frz: it levels off at the mismatch MM.

    MM = L*_frz - L* is measured separately by a large noise-free solve; the summary
    puts it next to the floor the risk curves reach.
    """
    _experiment(
        "mismatch",
        MismatchConfig,
        locals(),
        perturbations=parse_numbers("--perturbations", perturbations, float),
        ns=parse_numbers("--ns", ns),
        include_scratch=scratch,
    )


@app.command("task-order")
@user_errors
def task_order(
    out: Annotated[Path, typer.Option(help="Output directory for task_order.csv/.png.")],
    d: D = 30,
    r: R = 4,
    tasks: Annotated[int, typer.Option(help="Number of tasks (arrivals).")] = 10,
    heads: Annotated[
        int, typer.Option(help="Heads (outputs) per task, like classes per task.")
    ] = 4,
    n_max: Annotated[int, typer.Option(help="Samples per head of task ID 1 (the largest).")] = 1000,
    n_min: Annotated[
        int, typer.Option(help="Samples per head of the last task ID (the smallest).")
    ] = 50,
    first_rows: Annotated[
        int | None, typer.Option(help="Rows the first arrival adds (default r).")
    ] = None,
    rows_per_task: Annotated[int, typer.Option(help="Rows every later arrival adds (>= 0).")] = 1,
    orders: Annotated[
        str, typer.Option(help="Orders to run: " + ", ".join(TASK_ORDERS) + ".")
    ] = ",".join(TASK_ORDERS),
    activation: Activation = "relu",
    noise: Noise = 0.5,
    head_norm: HeadNorm = 2.5,
    inputs: Inputs = "sphere",
    replicates: Replicates = 3,
    n_test: Annotated[int, typer.Option(help="Test samples per head.")] = 1000,
    restarts: Restarts = 3,
    max_iter: MaxIter = 300,
    bound_slack: BoundSlack = 1.5,
    seed: Seed = 0,
    threads: Threads = 1,
    progress: ShowProgress = True,
) -> None:
    """Sequential CRL: large tasks first vs small tasks first vs individual.

    Sample sizes fall as floor(n_max * (n_min/n_max)^((ID-1)/(tasks-1))), as in the
    paper's figure on sample size.
    """
    names = tuple(o.strip() for o in orders.split(",") if o.strip())
    if not names:
        raise TheoryConfigError(f"--orders: got {orders!r}; accepted: {', '.join(TASK_ORDERS)}")
    _experiment("task_order", TaskOrderConfig, locals(), orders=names)


@app.command()
@user_errors
def report(
    csv_file: Path = typer.Argument(..., help="A CSV written by one of the theory commands."),
) -> None:
    """Recompute the summary and the figure of an experiment from its CSV alone."""
    if not csv_file.is_file():
        raise TheoryConfigError(f"CSV: no such file {csv_file}")
    _report(csv_file)
