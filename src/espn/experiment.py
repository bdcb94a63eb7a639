"""A continual-learning run: build benchmark, supernet and method, train task after task,
evaluate every task seen so far, write ``results.json`` and ``accuracy.png``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from espn import __version__
from espn.checkpoint.run import RunCheckpoint, check_out_dir
from espn.config import RunConfig
from espn.data.registry import BENCHMARKS, BenchmarkArgs
from espn.data.tasks import TaskSequence
from espn.evaluation.metrics import (
    average_accuracy,
    backward_transfer,
    final_accuracy,
    forgetting,
    task_accuracy,
)
from espn.evaluation.plots import plot_run
from espn.evaluation.storage import storage_report
from espn.methods.base import METHODS
from espn.models.registry import MODELS, ModelSpec
from espn.supernet.supernet import Supernet
from espn.training.engine import Engine
from espn.utils.io import write_json_atomic


def build_benchmark(cfg: RunConfig) -> TaskSequence:
    """The task sequence a run configuration names, on its device."""
    args = BenchmarkArgs(
        n_tasks=cfg.tasks,
        seed=cfg.seed,
        train_per_task=cfg.train_per_task,
        test_per_task=cfg.test_per_task,
        data_dir=cfg.data_dir,
        device=torch.device(cfg.device),
        folders=tuple(cfg.folders),
        image_size=cfg.image_size,
    )
    return BENCHMARKS.get(cfg.benchmark).build(args)


def build_supernet(cfg: RunConfig, seq: TaskSequence) -> Supernet:
    """The model named in ``cfg``, wrapped as a supernet on ``cfg.device``."""
    torch.manual_seed(cfg.seed)
    spec = ModelSpec(seq.input_shape, seq.n_classes, seq.multi_head)
    model = MODELS.get(str(cfg.model))(spec).to(cfg.device)
    first = seq.tasks[0]
    example = first.transform(first.train.x[first.train.index[:2]], False)
    return Supernet(model, example)


def task_record(supernet: Supernet, task: int) -> dict[str, Any]:
    """FLOPs and weight counts of a learned task's sub-network."""
    supernet.use_task(task)
    mask = supernet.masks[task]
    alive = supernet.alive_counts(mask.units)
    flops = supernet.flops(mask.units)
    return {
        "flops": flops,
        "flops_ratio": flops / supernet.dense_flops,
        "new_weights": mask.new_weights,
        "used_weights": supernet.used_weights(),
        "units_kept": sum(alive.values()) / max(sum(supernet.group_sizes.values()), 1),
    }


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
        "task_names": [t.name for t in seq.tasks[: len(per_task)]],
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


def run_experiment(
    cfg: RunConfig,
    progress: bool = True,
    on_task_end: Callable[[str], None] | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run ``cfg`` to the end; results are rewritten atomically after every evaluated task
    (every ``cfg.eval_every`` tasks and the last), and the checkpoint in ``<out>/checkpoint``
    after every task and every epoch.

    ``progress`` shows a progress bar; ``on_task_end`` receives a one-line summary per task;
    ``resume`` continues a killed run from its checkpoint (same options required); an ``out``
    that holds another run's checkpoint is refused unless ``resume`` or ``overwrite``.
    """
    start = time.perf_counter()
    out = Path(cfg.out)
    check_out_dir(out, resume, overwrite)
    seq = build_benchmark(cfg)
    supernet = build_supernet(cfg, seq)
    strategy = METHODS.get(cfg.method)(cfg.method_config())
    engine = Engine(
        supernet,
        strategy,
        cfg.optim_config(),
        int(cfg.batch_size),
        cfg.seed,
        progress,
        amp=cfg.amp,
    )
    ckpt = RunCheckpoint.open(cfg, seq, supernet, engine, strategy, resume)
    start -= ckpt.elapsed
    if ckpt.summary and on_task_end is not None:
        on_task_end(ckpt.summary)
    rows, per_task = ckpt.rows, ckpt.per_task
    doc = results_document(cfg, seq, supernet, rows, per_task)
    doc["wall_time_s"] = ckpt.elapsed
    steps = strategy.training_tasks(seq)
    for i, task in enumerate(steps):
        if i < len(rows):
            continue
        first = len(supernet.masks)
        log = engine.train_task(
            task,
            i,
            on_progress=ckpt.on_progress(i, strategy, seq, lambda: time.perf_counter() - start),
            resume=ckpt.resume_point(i),
        )
        learned = range(first, len(supernet.masks))  # one task, or all of them for MTL
        evaluated = (i + 1) % cfg.eval_every == 0 or i == len(steps) - 1
        rows.append(
            [task_accuracy(supernet, seq.tasks[j], j) for j in range(learned.stop)]
            if evaluated
            else None
        )
        for t in learned:
            record = task_record(supernet, t)
            record |= {
                "weight_budget": strategy.weight_budget,
                "seconds": log.seconds / len(learned),
                "seconds_per_epoch": log.seconds_per_epoch,
            }
            per_task.append(record)
        elapsed = time.perf_counter() - start
        if evaluated:
            doc = results_document(cfg, seq, supernet, rows, per_task)
            doc["wall_time_s"] = elapsed
            write_json_atomic(out / "results.json", doc)
        ckpt.task_done(seq, elapsed)
        if on_task_end is not None:
            row = rows[-1]
            # the mean of MTL's tasks
            acc = "-" if row is None else f"{sum(row[learned.start :]) / len(learned):.2f}%"
            new = sum(r["new_weights"] for r in per_task[learned.start :])
            on_task_end(
                f"task {learned.stop}/{len(seq)} {task.name}: acc {acc}  "
                f"FLOPs {record['flops_ratio']:.3f}  new weights {new}"
                f"/{record['weight_budget']}  ({log.seconds:.1f}s)"
            )
    plot_run(doc, out / "accuracy.png")
    return doc
