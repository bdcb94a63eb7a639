"""``espn evaluate``, ``espn export`` and ``espn info``: use a run's checkpoint on its own."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from espn.settings.training import MAX_COUNT, default, describe
from espn.utils.commands import (
    RUN_ALIAS,
    RUN_ARGUMENT,
    command_group,
    console,
    fail,
    run_directory,
    user_errors,
)
from espn.utils.text import printable

if TYPE_CHECKING:
    from espn.checkpoint.sizes import StoredRun
    from espn.export.export import ExportReport
    from espn.inference.export import AgnosticExportReport

app = command_group()

TRUST_OPTION = typer.Option(
    False,
    help="Import the Python module the run's model reference names (runs its code); without "
    "it a run directory never makes espn import a module that is not already imported.",
)

DATA_DIR_OPTION = typer.Option(
    None,
    help="Where the benchmark's data is (default: the data directory the run recorded); "
    "nothing is downloaded, into either.",
)


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


@app.command()
@user_errors
def evaluate(
    run_dir: Path | None = RUN_ARGUMENT,
    run_alias: Path | None = RUN_ALIAS,
    device: str = typer.Option(default("device"), help=describe("device")),
    batch_size: int = typer.Option(1024, min=1, max=MAX_COUNT, help="Evaluation batch size."),
    trust_model_code: bool = TRUST_OPTION,
    task_agnostic: bool = typer.Option(
        False,
        "--task-agnostic",
        help="Also predict without the task: infer each test sample's task (--rule), report "
        "per task the accuracy per sample and per batch of 32 and how often the task is "
        "picked right, store it in results.json and plot the task-confusion matrix.",
    ),
    rule: str | None = typer.Option(
        None,
        help="With --task-agnostic: the task-inference rule (see docs/task-agnostic.md), or "
        "'all': one row per rule the run can use. Default: the run's best on its tasks' "
        "held-out samples (runs learned with --task-agnostic), else input-gaussian.",
    ),
    data_dir: Path | None = DATA_DIR_OPTION,
) -> None:
    """Re-compute each task's test accuracy from the checkpoint alone.

    Every finished task is evaluated on its test data and compared with results.json; the exit
    status is 1 if any differs. With --task-agnostic, also without the task given.
    """
    from espn.evaluation.results import read_results
    from espn.inference.predict import get_rule

    run = _checkpointed(run_directory(run_dir, run_alias))
    _check_rule(task_agnostic, rule)
    learner = _loaded(run, device, trust_model_code, True, data_dir)
    n = len(learner.tasks)
    if not n:
        console.print(
            f"{printable(str(run))}: no task is finished yet, so none to evaluate",
            soft_wrap=True,
        )
        return
    if task_agnostic and rule != "all":
        get_rule(rule, learner.supernet)  # a rule these tasks cannot run: before any evaluation
    doc = read_results(run)  # checked
    source = "results.json" if doc else "checkpoint"
    mismatches = _compare(learner, doc, source, batch_size)
    if task_agnostic:
        tasks = [task for task in learner.tasks if task is not None]
        task_agnostic_report(run, learner.supernet, tasks, rule)
    if mismatches:
        fail(f"tasks {mismatches} differ from {source}", code=1)
    console.print(f"all {n} tasks match {source}")


def _checkpointed(run: Path) -> Path:
    """``run``, refused before torch is loaded when it holds no checkpoint."""
    if not (run / "checkpoint" / "manifest.json").is_file():
        fail(f"no checkpoint in {run / 'checkpoint'} (manifest.json not found)")
    return run


def _check_rule(task_agnostic: bool, rule: str | None) -> None:
    """``--rule``: an option of ``--task-agnostic``, a known rule's name or ``all``."""
    from espn.inference import DEFAULT_RULE, RULES

    if rule is not None and not task_agnostic:
        fail("--rule is an option of --task-agnostic; add --task-agnostic")
    if task_agnostic and rule != "all":
        RULES.get(rule or DEFAULT_RULE)  # an unknown name: refused before any work


def _compare(learner: Any, doc: dict[str, Any] | None, source: str, batch_size: int) -> list[int]:
    """Print each task's accuracy beside ``source``'s; the tasks that differ."""
    from espn.evaluation.metrics import final_accuracy

    rows = [r for r in learner.accuracy_matrix if r is not None]
    reported = doc["final_accuracy"] if doc else (final_accuracy(rows) if rows else [])
    table = Table("task", "name", "accuracy %", f"{source} %", "match")
    mismatches = []
    for t in range(len(learner.tasks)):
        acc = learner.evaluate(t, batch_size=batch_size)
        want = reported[t] if t < len(reported) else None
        ok = want is not None and acc == want
        if not ok:
            mismatches.append(t)
        table.add_row(
            str(t),
            printable(learner.names[t]),
            f"{acc:.2f}",
            "-" if want is None else f"{want:.2f}",
            "yes" if ok else "NO",
        )
    console.print(table)
    return mismatches


def task_agnostic_report(run: Path, supernet: Any, tasks: list[Any], rule: str | None) -> None:
    """Measure, print and store (results.json, the confusion plots) task-agnostic prediction
    with ``rule`` (None: the run's default; ``"all"``: every rule the run can use, then one
    row per rule)."""
    from espn.inference import evaluate_named
    from espn.inference.report import plot_confusion, plot_name, store

    names = [t.name for t in tasks]
    docs = evaluate_named(supernet, tasks, rule)
    if rule == "all":
        console.print(rules_table(docs))
    for doc in docs:
        if rule != "all":
            console.print(agnostic_table(doc, names))
        plot = run / plot_name(doc["rule"])
        plot_confusion(doc, plot, names)
        kept = "results.json" if store(run, doc) else "no results.json to store it in"
        console.print(
            f"rule {doc['rule']}{' (default)' if doc['default'] else ''}: routing "
            f"{doc['flops_passes']:.2f} dense passes per sample; stored in {kept}; task "
            f"confusion plotted in {plot}"
        )


def rules_table(docs: list[dict[str, Any]]) -> Table:
    """One row per rule: its averages over the tasks, routing FLOPs and bytes per task."""
    table = Table(
        "rule",
        "task given %",
        "per sample %",
        f"per batch of {docs[0]['batch'] if docs else 32} %",
        "task picked %",
        "routing FLOPs (dense passes)",
        "stored per task",
        title="prediction without the task, every rule (* the run's default)",
    )
    for doc in docs:
        avg, stored = doc["average"], doc["statistics_bytes"]
        table.add_row(
            doc["rule"] + (" *" if doc["default"] else ""),
            *(f"{avg[k]:.2f}" for k in ("given", "per_sample", "per_batch", "task_picked")),
            f"{doc['flops_passes']:.2f}",
            _mib(sum(stored) / max(len(stored), 1)),
        )
    return table


def agnostic_table(doc: dict[str, Any], names: list[str]) -> Table:
    """Per task and on average: accuracy with the task given, without it per sample and per
    batch, and how often the task is picked right."""
    batch = doc["batch"]
    table = Table(
        "task",
        "name",
        "task given %",
        "per sample %",
        f"per batch of {batch} %",
        "task picked %",
        "per batch %",
        title=f"prediction without the task, rule {doc['rule']}",
    )
    keys = ("given", "per_sample", "per_batch", "task_picked", "task_picked_per_batch")
    for r in doc["tasks"]:
        name = names[r["task"]] if r["task"] < len(names) else ""
        table.add_row(str(r["task"]), name, *(f"{r[k]:.2f}" for k in keys))
    table.add_row("all", "average", *(f"{doc['average'][k]:.2f}" for k in keys))
    return table


@app.command("export")
@user_errors
def export_command(
    run_dir: Path | None = RUN_ARGUMENT,
    run_alias: Path | None = RUN_ALIAS,
    task: int | None = typer.Option(
        None, help="Task index, 0-based as in results.json (or give --task-agnostic)."
    ),
    out: Path = typer.Option(..., help="Output file: NAME.pt2 (torch.export) or NAME.onnx."),
    onnx: bool | None = typer.Option(
        None, help="With a .pt2 output, also write NAME.onnx (default: if onnx is installed)."
    ),
    check_data: bool = typer.Option(
        True, help="Check the exported model on the task's test data (else on random inputs)."
    ),
    device: str = typer.Option("cpu", help="Device the model is traced and checked on."),
    fold_bn: bool = typer.Option(
        True, "--fold-bn/--keep-bn", help="Fold BatchNorm into the convolution before it."
    ),
    trust_model_code: bool = TRUST_OPTION,
    task_agnostic: bool = typer.Option(
        False,
        "--task-agnostic",
        help="Instead of one task: one model of every task that infers each input's task "
        "(--rule) and returns (class, task).",
    ),
    rule: str | None = typer.Option(
        None, help="With --task-agnostic: the task-inference rule (see docs/task-agnostic.md)."
    ),
    data_dir: Path | None = DATA_DIR_OPTION,
    overwrite: bool = typer.Option(
        False,
        help="Replace existing files of the export (OUT, its .onnx and .json); a run "
        "directory's own files are never replaced.",
    ),
) -> None:
    """Write one task as a slim standalone model (.pt2 / .onnx), or with --task-agnostic one
    model that predicts without the task.

    Pruned units are physically removed and the task's head attached; the model is checked to
    match the supernet within 1e-5 x max(1, largest |output|) and to have the FLOPs that
    results.json reports. A task-agnostic model holds every task's slim sub-network and the
    rule's statistics; it is checked to pick the same task and class as espn's prediction.
    """
    if (task is None) == (not task_agnostic):
        fail("give either --task N (one task) or --task-agnostic (every task, task inferred)")
    run = _checkpointed(run_directory(run_dir, run_alias))
    _check_rule(task_agnostic, rule)
    _check_export(run, out, onnx, overwrite, task)
    learner = _loaded(run, device, trust_model_code, check_data, data_dir, task)
    data = None if check_data else _random_inputs(learner)
    if task is None:
        n = len(learner.tasks)  # the random inputs shared out over the tasks
        given = None if data is None else list(zip(*(d.tensor_split(n) for d in data), strict=True))
        agnostic = learner.export_task_agnostic(out, given, rule, onnx, fold_bn, overwrite)
        console.print(_agnostic_summary(agnostic, out, "test" if check_data else "random"))
        return
    report = learner.export(task, out, data, onnx, fold_bn, overwrite)
    console.print(_export_summary(task, report, out, "test" if check_data else "random"))


def _agnostic_summary(agnostic: AgnosticExportReport, out: Path, inputs: str) -> str:
    """What ``espn export --task-agnostic`` wrote and checked on ``inputs``."""
    return (
        f"{agnostic.tasks} tasks, rule {agnostic.rule}: wrote {', '.join(agnostic.files)}\n"
        f"  {agnostic.parameters} parameters; returns (class, task) per input\n"
        f"  same task and class as espn's prediction on {agnostic.checked_samples} "
        f"{inputs} inputs ({agnostic.ties} float32 ties not "
        f"compared)\n  load it without espn: {load_hint(out, agnostic.files)}"
    )


def _export_summary(task: int, report: ExportReport, out: Path, inputs: str) -> str:
    """What ``espn export --task N`` wrote and checked (on ``inputs``: test or random)."""
    return (
        f"task {task}: wrote {', '.join(report.files)}\n"
        f"  {report.parameters} parameters, {report.flops} FLOPs per sample "
        f"({report.flops / report.dense_flops:.3f} of the dense supernet, as results.json says)\n"
        f"  max |output - supernet output| = {report.max_abs_diff:.2e} "
        f"on {report.checked_samples} {inputs} inputs "
        f"(allowed {report.tolerance:.2e}; outputs up to {report.max_abs_output:.3g})\n"
        f"  load it without espn: {load_hint(out, report.files)}\n"
        f"  {input_line(report.inputs)}"
    )


def _check_export(
    run: Path, out: Path, onnx: bool | None, overwrite: bool, task: int | None
) -> None:
    """Refuse, before any work, an export target or a model it cannot write."""
    from espn.checkpoint.format import checkpoint_dir, read_manifest
    from espn.export.export import check_not_replacing, check_target, export_files
    from espn.runs.loading import check_rebuildable

    check_target(out)
    check_not_replacing(export_files(out, onnx), overwrite, run)
    then = (
        f"learner.export({task}, {str(out)!r})"
        if task is not None
        else f"learner.export_task_agnostic({str(out)!r}, data=[(x, y) per task])"
    )
    check_rebuildable(run, str(read_manifest(checkpoint_dir(run))["model"]), then)


def _loaded(
    run: Path,
    device: str,
    trust_model_code: bool,
    check_data: bool,
    data_dir: Path | None,
    task: int | None = None,
) -> Any:
    """The learner of ``run`` (test data when ``check_data``); ``task`` finished."""
    from espn.api.functions import load
    from espn.checkpoint.format import CheckpointError

    learner = load(
        run,
        device=device,
        benchmark_data=check_data,
        data_dir=data_dir,
        trust_model_code=trust_model_code,
    )
    n = len(learner.tasks)
    if task is not None and not 0 <= task < n:
        raise CheckpointError(
            f"task {task} is not in the checkpoint; it holds tasks 0..{n - 1}"
            if n
            else f"task {task} is not in the checkpoint; it holds no finished task yet"
        )
    return learner


def _random_inputs(learner: Any) -> Any:
    """``--no-check-data``: 256 random model inputs (seeded), as ``(x, y)`` data."""
    import torch

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, *learner.supernet.input_shape, generator=gen).to(learner.device)
    return x, torch.zeros(len(x), dtype=torch.long, device=x.device)


def input_line(inputs: dict) -> str:
    """What the exported program takes, in words."""
    shape = ", ".join(map(str, inputs["shape"]))
    if inputs["raw"]:
        return (
            f"it takes raw inputs: {inputs['dtype']} [N, {shape}] as the dataset stores them "
            "(the task's input transform is in the program; the .json beside it records it)"
        )
    return (
        f"it takes model inputs: {inputs['dtype']} [N, {shape}], already transformed "
        "(--no-check-data: the benchmark was not built, so no input transform is included)"
    )


def load_hint(out: Path, files: list[str]) -> str:
    """How to load the file written to ``out`` without espn (torch.export or ONNX Runtime)."""
    if out.suffix == ".onnx":
        return f"onnxruntime.InferenceSession({str(out)!r})"
    hint = f"torch.export.load({str(out)!r}).module()"
    onnx = out.with_suffix(".onnx")
    return hint + (
        f", or onnxruntime.InferenceSession({str(onnx)!r})" if str(onnx) in files else ""
    )


@app.command()
@user_errors
def info(
    run_dir: Path | None = RUN_ARGUMENT,
    run_alias: Path | None = RUN_ALIAS,
) -> None:
    """Print per-task FLOPs, weights and storage, and the checkpoint's size.

    Per task: FLOPs ratio, weights used, new weights (those it owns), the form its weight masks
    are stored in, the bytes of its masks and of its BatchNorm/gates/head, the task's bytes in
    all, and its file's size; then the owner ids and the whole checkpoint's size next to one
    dense model per task. Read from storage alone (the manifest, the task records and the
    safetensors headers): no model is built and no model code imported, so it works on any
    run, also one saved from a model instance.
    """
    run = _checkpointed(run_directory(run_dir, run_alias))
    from espn.checkpoint.format import checkpoint_dir
    from espn.checkpoint.sizes import read_sizes
    from espn.runs.checks import check_results_match

    stored = read_sizes(checkpoint_dir(run))
    m = stored.manifest
    check_results_match(run, m)
    cfg, training = m["config"], m.get("training")
    # nine columns, not cut off in a pipe; text printed as written (no markup)
    wide = Console(width=max(console.width, 132), markup=False)
    wide.print(
        printable(
            f"{run}: {cfg.get('method')} on {cfg.get('benchmark')} with {m['model']}, gamma "
            f"{cfg.get('gamma')}, alpha {cfg.get('alpha')}; {len(stored.tasks)}/"
            f"{m.get('n_tasks', '?')} tasks finished"
        )
        + ("" if training is None else f", task {training['task']} in training")
    )
    table, dense_total = _task_table(stored)
    wide.print(table)
    bits = m.get("owner_bits")
    wide.print(
        f"owner ids: {_mib(stored.owner_bytes)} ({bits} bits per weight, for all tasks together)"
        if stored.owner_bytes
        else "owner ids: none stored (a version-1 checkpoint: each task's masks hold them)"
    )
    task_bytes = sum(t.file for t in stored.tasks)
    wide.print(
        f"checkpoint {_mib(stored.total)} on disk: shared weights, owner ids and RNG state "
        f"{_mib(stored.state_file)}"
        + ("" if training is None else " (with the task in training and its optimizer)")
        + f", {len(stored.tasks)} task files {_mib(task_bytes)}, manifest "
        f"{_mib(stored.files['manifest.json'])}"
    )
    if dense_total:
        wide.print(
            f"one dense model per task: {len(stored.tasks)} x {_mib(stored.weight_bytes)} "
            f"weights + own BN/gates/head = {_mib(dense_total)}; the checkpoint is "
            f"{stored.total / dense_total:.3f} of that"
        )


def _task_table(stored: StoredRun) -> tuple[Table, int]:
    """``espn info``'s table, a row per stored task, and the bytes of one dense model per
    task (the shared weights plus each task's own BatchNorm/gates/head)."""
    table = Table(
        "task",
        "FLOPs ratio",
        "weights used",
        "new weights owned",
        "masks as",
        "mask B",
        "BN/head B",
        "task B",
        "file B",
    )
    dense_total = 0
    for t, task in enumerate(stored.tasks):
        record = task.record
        dense_total += stored.weight_bytes + task.state_bytes
        ratio = record.get("flops_ratio")
        used = record.get("used_weights")
        table.add_row(
            str(t),
            "-" if ratio is None else f"{ratio:.3f}",
            "-" if used is None else f"{used:,}",
            f"{task.entry['new_weights']:,}",
            "+".join(task.forms),
            f"{task.mask_bytes:,}",
            f"{task.state_bytes:,}",
            f"{task.nbytes:,}",
            f"{task.file:,}",
        )
    return table, dense_total
