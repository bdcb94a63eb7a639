"""Task order: the sequential variant (CRL-SEQ) with sample sizes that fall geometrically over
the task IDs, trained large-first, small-first and individually (from scratch), as in the
paper's figure on sample size."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import mean
from typing import Any

from torch import Tensor

from espn.theory.common import (
    Progress,
    evaluate,
    mean_curve,
    replicate,
    solver_config,
    tick,
)
from espn.theory.config import TASK_ORDERS, TaskOrderConfig
from espn.theory.planted import derive_seed
from espn.theory.solver import SequentialResult, solve_crl, solve_sequential


def run_task_order(cfg: TaskOrderConfig, progress: Progress | None = None) -> list[dict[str, Any]]:
    """Sequential CRL with falling sample sizes, in decreasing and increasing order: task ID
    ``i`` has ``heads`` heads of ``sizes[i]`` samples on one ``W*``; the first arrival adds
    ``first_rows`` rows, later ones ``rows_per_task`` (like ESPN's weight budget);
    ``individual`` learns each task alone from scratch with ``first_rows`` rows."""
    cfg.validate()
    rows: list[dict[str, Any]] = []
    sizes = cfg.sizes
    groups = [list(range(i * cfg.heads, (i + 1) * cfg.heads)) for i in range(cfg.tasks)]
    new_rows = [cfg.rows_first] + [cfg.rows_per_task] * (cfg.tasks - 1)
    per_head = [n for n in sizes for _ in range(cfg.heads)]
    for rep in range(cfg.replicates):
        model, train, test, test_clean = replicate(cfg, rep, per_head, cfg.tasks * cfg.heads)
        base = {"replicate": rep, "heads": cfg.heads, "noise_floor": model.noise_floor}
        for order in cfg.orders:
            solver = solver_config(cfg, model, derive_seed(cfg.seed, rep, order))
            if order == "individual":
                for i, group in enumerate(groups):
                    sol = solve_crl(train.select(group), cfg.rows_first, None, solver)
                    risks = evaluate(sol.predict, group, test, test_clean)
                    size = (sizes[i], cfg.rows_first, cfg.rows_first)
                    rows.append(_row(base, order, i, 1, size, sol.train_loss, risks))
                    tick(progress)
                continue
            ids = list(range(cfg.tasks)) if order == "decreasing" else list(range(cfg.tasks))[::-1]
            result = solve_sequential(
                train,
                [groups[i] for i in ids],
                new_rows,
                None,
                solver,
                on_arrival=(lambda _step: tick(progress)),
            )
            for position, i in enumerate(ids, start=1):
                group = groups[i]
                risks = evaluate(_heads_of(result, group), group, test, test_clean)
                size = (sizes[i], result.W[group[0]].shape[0], new_rows[position - 1])
                loss = mean(result.train_loss[t] for t in group)
                rows.append(_row(base, order, i, position, size, loss, risks))
    return rows


def _row(
    base: dict[str, Any],
    order: str,
    task_id: int,
    position: int,
    size: tuple[int, int, int],
    train_loss: float,
    risks: tuple[float, float],
) -> dict[str, Any]:
    """One CSV row; ``size`` is (N, rows, new rows), ``risks`` (test risk, excess risk)."""
    n, n_rows, new_rows = size
    return {
        **base,
        "order": order,
        "task_id": task_id,
        "position": position,
        "N": n,
        "rows": n_rows,
        "new_rows": new_rows,
        "train_loss": train_loss,
        "test_risk": risks[0],
        "excess_risk": risks[1],
    }


def _heads_of(result: SequentialResult, group: list[int]) -> Callable[[Tensor, int], Tensor]:
    """``predict(X, j)`` of the ``j``-th head of ``group``."""
    return lambda X, j: result.predict(X, group[j])


def summarize_task_order(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Average risks per order: over all tasks, the larger half and the smaller half."""
    ids = sorted({int(r["task_id"]) for r in rows})
    half = len(ids) // 2
    large, small = set(ids[: max(half, 1)]), set(ids[max(half, 1) :])
    orders = []
    for order in TASK_ORDERS:
        group = [r for r in rows if r["order"] == order]
        if not group:
            continue

        def avg(
            key: str, subset: set[int] | None = None, group: list[dict[str, Any]] = group
        ) -> float | None:
            vals = [float(r[key]) for r in group if subset is None or int(r["task_id"]) in subset]
            return mean(vals) if vals else None

        orders.append(
            {
                "order": order,
                "average_excess": avg("excess_risk"),
                "average_test_risk": avg("test_risk"),
                "large_tasks_excess": avg("excess_risk", large),
                "small_tasks_excess": avg("excess_risk", small),
                "per_task_excess": [p[1] for p in mean_curve(group, "task_id")],
            }
        )
    return {
        "task_ids": ids,
        "sizes": [int(next(r["N"] for r in rows if int(r["task_id"]) == i)) for i in ids],
        "noise_floor": mean(float(r["noise_floor"]) for r in rows),
        "orders": orders,
    }
