"""A continual-learning run: build benchmark, supernet and method, train task after task,
evaluate every task seen so far, write ``results.json`` and ``accuracy.png``."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from espn import __version__
from espn.checkpoint.continuation import adopt_tasks, check_compatible, open_source
from espn.checkpoint.format import CheckpointError, checkpoint_dir, manifest_or_none
from espn.checkpoint.lock import run_lock
from espn.checkpoint.run import RunCheckpoint, check_out_dir
from espn.config import ConfigError, RunConfig, check_applicable, make_config, resolved
from espn.data.order import ordered
from espn.data.registry import BENCHMARKS, BenchmarkArgs
from espn.data.tasks import TaskSequence, prepended
from espn.evaluation.metrics import (
    average_accuracy,
    backward_transfer,
    final_accuracy,
    forgetting,
)
from espn.evaluation.plots import plot_run
from espn.evaluation.storage import storage_report
from espn.learning import Learned, TaskRunner
from espn.methods.base import METHODS
from espn.models import registry as models
from espn.models.registry import ModelSpec
from espn.preflight import check_run
from espn.supernet.pretrained import expected_shapes, load_weight_file
from espn.supernet.supernet import Supernet
from espn.training.engine import Engine, TrainingStopped
from espn.utils.io import os_error_text, write_json_atomic


def build_benchmark(cfg: RunConfig, download: bool = True) -> TaskSequence:
    """The task sequence a run configuration names, on its device: the benchmark's tasks
    (``train_sizes`` images each) in ``task_order``, after the tasks kept from ``from_run``.
    ``download`` off: a dataset missing from ``data_dir`` is refused, not fetched (the
    configuration was read from a run directory, whose data directory is only read; so is a
    ``from_run`` source's)."""
    sizes = cfg.task_train_sizes()
    args = BenchmarkArgs(
        n_tasks=cfg.tasks,
        seed=cfg.seed if cfg.task_seed is None else cfg.task_seed,
        class_order=cfg.class_order,
        train_per_task=cfg.train_per_task,
        test_per_task=cfg.test_per_task,
        data_dir=cfg.data_dir,
        device=torch.device(cfg.device),
        folders=tuple(cfg.folders),
        image_size=cfg.image_size,
        train_sizes=None if sizes is None else tuple(sizes),
        download=download,
    )
    seq = ordered(BENCHMARKS.get(cfg.benchmark).build(args), cfg.task_order, args.seed)
    if cfg.from_run is None:
        return seq
    source = open_source(cfg)
    return prepended(build_benchmark(source.config, download=False), source.keep, seq)


def build_supernet(cfg: RunConfig, seq: TaskSequence) -> Supernet:
    """The model named in ``cfg``, wrapped as a supernet on ``cfg.device``."""
    spec = ModelSpec(
        seq.input_shape, seq.n_classes, seq.multi_head, cfg.task_affine, cfg.stream_pruning
    )
    first = seq.tasks[0]
    example = first.transform(first.train.x[first.train.index[:2]], False)
    return models.build_supernet(str(cfg.model), spec, example, cfg.seed, cfg.device)


def results_document(
    cfg: RunConfig,
    seq: TaskSequence,
    supernet: Supernet,
    rows: list[list[float] | None],
    per_task: list[dict],
) -> dict[str, Any]:
    """The ``results.json`` document of a (possibly unfinished) run.

    ``rows`` has one accuracy row per training step (per task, or a single row for MTL's
    joint training), None where ``eval_every`` skipped the evaluation; ``per_task`` one
    record per learned task.
    """
    column = {k: [r[k] for r in per_task] for k in per_task[0]} if per_task else {}
    rows_seen = any(r is not None for r in rows)
    storage = storage_report(supernet, METHODS.get(cfg.method).weights)
    return {
        "espn_version": __version__,
        "method": cfg.method,
        "benchmark": cfg.benchmark,
        "model": cfg.model,
        "seed": cfg.seed,
        "gamma": cfg.gamma,
        "alpha": cfg.alpha,
        "config": cfg.model_dump(mode="json"),
        "task_names": seq.names(len(per_task)),
        "complete": len(per_task) == len(seq),
        "accuracy_matrix": rows,
        "final_accuracy": final_accuracy(rows) if rows_seen else [],
        "average_accuracy": average_accuracy(rows) if rows_seen else None,
        "forgetting": forgetting(rows) if rows_seen else [],
        "backward_transfer": backward_transfer(rows) if rows_seen else None,
        "dense_flops": supernet.dense_flops,
        "total_weights": supernet.total_weights,
        "storage_bytes": storage["total"],
        "storage": storage,
        **column,
    }


def data_warnings(cfg: RunConfig, seq: TaskSequence) -> list[str]:
    """Requests the data could not honour (more images per task than there are)."""
    notes = []
    first = cfg.after_task or 0  # tasks kept from --from-run were checked by their run
    sizes = cfg.task_train_sizes()
    if sizes is not None:
        order = seq.info.get("given_positions")  # set by a --task-order other than given
        given = order if isinstance(order, list) else range(len(sizes))
        short = [
            (sizes[g], len(task.train))
            for g, task in zip(given, seq.tasks[first:], strict=True)
            if len(task.train) < sizes[g]
        ]
        if short:
            notes.append(
                f"train_sizes asks for up to {max(a for a, _ in short)} training images but "
                f"{len(short)} task(s) have fewer (as few as {min(h for _, h in short)}); "
                "all of theirs are used (results.json: train_samples per task)"
            )
    for split, asked in (("train", cfg.train_per_task), ("test", cfg.test_per_task)):
        if asked is None or (split == "train" and sizes is not None):
            continue
        have = min(len(task.split(split)) for task in seq.tasks[first:])
        if have < asked:
            notes.append(
                f"{split}_per_task {asked} is more than the {have} {split} images a task has; "
                f"all of them are used (results.json: {split}_samples per task)"
            )
    return notes


def run_experiment(
    cfg: RunConfig,
    progress: bool = True,
    on_task_end: Callable[[str], None] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    seq: TaskSequence | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` to the end; results are rewritten atomically after every evaluated task
    (every ``cfg.eval_every`` tasks and the last), and the checkpoint in ``<out>/checkpoint``
    after every task and every epoch.

    ``progress`` shows a progress bar; ``on_task_end`` receives a one-line summary per task;
    ``resume`` continues a killed run from its checkpoint (same options required); an ``out``
    that holds another run's output is refused unless ``resume`` or ``overwrite``; a second
    run on the same ``out`` is refused while one holds it (a lock file with its pid).
    ``on_warning`` receives what the run could not do as asked (also in results.json).
    Training stops with :class:`TrainingStopped` (the last good checkpoint kept) rather than
    commit a task that breaks a budget or learned from a non-finite loss. ``seq``, when given,
    is the benchmark ``cfg`` names, built once by the caller (so that another library can be
    handed the very same tensors, see ``benchmarks/peer_packnet.py``).
    """
    check_run(cfg)
    check_out_dir(cfg.out, resume, overwrite)
    with run_lock(cfg.out):
        check_out_dir(cfg.out, resume, overwrite)  # again, now that no other run can write
        if overwrite:  # the earlier run's results go now, not when the first task is done
            for name in ("results.json", "accuracy.png"):
                (Path(cfg.out) / name).unlink(missing_ok=True)
        try:
            return _run_locked(cfg, progress, on_task_end, resume, on_warning, seq)
        except TrainingStopped as exc:
            raise TrainingStopped(f"{exc}; {_kept(cfg)}") from None


def run(
    config: RunConfig | None = None,
    *,
    progress: bool = False,
    on_task_end: Callable[[str], None] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """One run as ``espn run`` makes it, from Python: its ``results.json`` document.

    Give ``espn run``'s options as keywords (``benchmark``, ``method``, ``out``, ``tasks``,
    ``train_per_task``, ``gamma``, ``epochs=(3, 4, 3)``, a method's own options such as
    ``supsup_k``, ...: the :class:`~espn.config.RunConfig` fields) or a ready ``RunConfig``;
    each value is checked before any work (:class:`~espn.config.ConfigError` naming it).
    The run directory ``out`` gets what the CLI writes (``results.json``, ``accuracy.png``,
    ``checkpoint/``); ``resume`` and ``overwrite`` are the CLI's ``--resume``/``--overwrite``,
    ``progress`` shows the progress bar, ``on_task_end`` receives the per-task lines, and what
    the run could not do as asked is issued as a Python warning (and kept in the document).

    Example: ``espn.run(benchmark="permuted-fashion-mnist", tasks=2, train_per_task=500,
    out="runs/mine")["average_accuracy"]``.
    """
    if config is not None and options:
        raise ConfigError(
            f"give a RunConfig or keyword options, not both (got {', '.join(sorted(options))})"
        )
    cfg = config if config is not None else make_config(**options)
    if config is None:
        check_applicable(options, cfg)
    return run_experiment(
        cfg,
        progress=progress,
        on_task_end=on_task_end,
        resume=resume,
        overwrite=overwrite,
        on_warning=lambda line: warnings.warn(line, UserWarning, stacklevel=3),
    )


def _kept(cfg: RunConfig) -> str:
    """Where a stopped run's last good state is, and how to go on from it."""
    directory = checkpoint_dir(cfg.out)
    manifest = manifest_or_none(directory)
    if manifest is None:
        return "no task was finished, so nothing was kept"
    done = len(manifest["tasks"])
    return (
        f"the last good checkpoint is {directory} ({done} task(s) finished, in "
        f"{Path(cfg.out) / 'results.json'})"
    )


def task_done(
    cfg: RunConfig,
    seq: TaskSequence,
    supernet: Supernet,
    runner: TaskRunner,
    ckpt: RunCheckpoint,
    notes: list[str],
    elapsed: float,
) -> dict[str, Any]:
    """After a step: rewrite ``results.json``, then the checkpoint; the new document."""
    out = Path(cfg.out)
    doc = results_document(cfg, seq, supernet, runner.rows, runner.records)
    doc |= {"warnings": notes, "wall_time_s": elapsed}
    try:
        write_json_atomic(out / "results.json", doc)
    except OSError as exc:
        raise CheckpointError(
            f"could not write {out / 'results.json'} ({os_error_text(exc)}); the checkpoint "
            f"in {checkpoint_dir(out)} is intact and --resume continues from it"
        ) from None
    ckpt.task_done(seq, doc["wall_time_s"])
    return doc


def task_line(learned: Learned, records: list[dict[str, Any]], n_tasks: int, name: str) -> str:
    """The one-line summary of a learned step (the mean accuracy of MTL's tasks)."""
    tasks, row = learned.tasks, learned.row
    acc = "-" if row is None else f"{sum(row[tasks.start :]) / len(tasks):.2f}%"
    new = sum(r["new_weights"] for r in records[tasks.start :])
    last = records[-1]
    which = f"task {tasks.start}" if len(tasks) == 1 else f"tasks {tasks.start}..{tasks.stop - 1}"
    return (
        f"{which} ({tasks.stop}/{n_tasks} done) {name}: acc {acc}  "
        f"FLOPs {last['flops_ratio']:.3f}  "
        f"new weights {new}/{last['weight_budget']}  ({learned.log.seconds:.1f}s)"
    )


def _run_locked(
    cfg: RunConfig,
    progress: bool,
    on_task_end: Callable[[str], None] | None,
    resume: bool,
    on_warning: Callable[[str], None] | None,
    seq: TaskSequence | None,
) -> dict[str, Any]:
    start = time.perf_counter()
    out = Path(cfg.out)
    seq = build_benchmark(cfg) if seq is None else seq
    source = None if cfg.from_run is None else open_source(cfg)
    if source is not None:
        check_compatible(cfg, source, seq)
    supernet = build_supernet(cfg, seq)
    strategy = METHODS.get(cfg.method)(cfg.method_config())
    engine = Engine(
        supernet,
        strategy,
        cfg.optim_config(),
        int(resolved(cfg.batch_size, "batch_size")),
        cfg.seed,
        progress,
        amp=cfg.amp,
        reference_size=cfg.floor_reference(),
    )
    runner = TaskRunner(supernet, strategy, engine)
    runner.check_gamma_reachable(cfg.model)
    notes = data_warnings(cfg, seq)
    if on_warning is not None:
        for note in notes:
            on_warning(note)
    ckpt = RunCheckpoint.open(cfg, seq, supernet, engine, strategy, resume)
    if source is not None and not ckpt.rows:  # a fresh start on top of another run
        ckpt.rows, ckpt.per_task = adopt_tasks(supernet, source)
    runner.rows, runner.records = ckpt.rows, ckpt.per_task  # the checkpoint saves them
    start -= ckpt.elapsed
    if ckpt.summary and on_task_end is not None:
        on_task_end(ckpt.summary)
    doc = results_document(cfg, seq, supernet, ckpt.rows, ckpt.per_task) | {"warnings": notes}
    doc["wall_time_s"] = ckpt.elapsed
    pretrained = None
    if cfg.init_weights is not None and not ckpt.rows:
        pretrained = load_weight_file(cfg.init_weights)
        expected_shapes(supernet, seq.tasks[0].n_classes)  # refused now, not after training
    steps = strategy.training_tasks(seq)
    for i, task in enumerate(steps):
        if i < len(runner.rows):
            continue
        learned = runner.learn(
            task,
            i,
            seq.tasks,
            evaluate=(i + 1) % cfg.eval_every == 0 or i == len(steps) - 1,
            pretrained=pretrained if i == 0 else None,  # the first task, from --init-weights
            on_progress=ckpt.on_progress(i, strategy, seq, lambda: time.perf_counter() - start),
            resume=ckpt.resume_point(i),
        )
        doc = task_done(cfg, seq, supernet, runner, ckpt, notes, time.perf_counter() - start)
        if on_task_end is not None:
            on_task_end(task_line(learned, runner.records, len(seq), task.name))
    plot_run(doc, out / "accuracy.png")
    return doc
