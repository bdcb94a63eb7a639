"""The ``results.json`` document of a run (written by :mod:`espn.run_directory`)."""

from __future__ import annotations

from typing import Any

from espn import __version__
from espn.config import RunConfig
from espn.data.tasks import TaskSequence
from espn.evaluation.metrics import (
    average_accuracy,
    backward_transfer,
    final_accuracy,
    forgetting,
)
from espn.evaluation.storage import storage_report
from espn.methods.base import METHODS
from espn.supernet.supernet import Supernet


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
