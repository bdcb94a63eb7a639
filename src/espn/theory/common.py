"""What the theory-lab experiments share: the planted model and solver of a configuration, the
risk evaluation, and the curves of the summaries (computed from CSV rows) and figures."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from statistics import mean
from typing import Any

import torch

from espn.theory.config import MismatchConfig, PlantedConfig, SampleComplexityConfig
from espn.theory.planted import PlantedModel, TaskData, derive_seed, generator
from espn.theory.solver import SolverConfig, solve_crl

Progress = Callable[[int], None]
#: a replicate: its planted model, training set, and test set with noisy and clean labels
Replicate = tuple[PlantedModel, TaskData, TaskData, TaskData]


def replicate(
    cfg: PlantedConfig, rep: int, train_n: int | Sequence[int], tasks: int | None = None
) -> Replicate:
    """Replicate ``rep``: its planted model (its own ``W*`` and ``tasks`` heads, default
    ``cfg.tasks``), a training draw of ``train_n`` samples per task (or ``train_n[t]`` for
    task ``t``) and a test set of ``cfg.n_test`` per task, with noisy and with clean labels."""
    model = PlantedModel.create(
        cfg.d,
        cfg.r,
        tasks or cfg.tasks,
        activation=cfg.activation,
        noise=cfg.noise,
        head_norm=cfg.head_norm,
        seed=derive_seed(cfg.seed, "replicate", rep),
        inputs=cfg.inputs,
    )
    train, _ = model.sample(train_n, generator(cfg.seed, "train", rep))
    test, test_clean = model.sample(cfg.n_test, generator(cfg.seed, "test", rep))
    return model, train, test, test_clean


def solver_config(cfg: PlantedConfig, model: PlantedModel, seed: int) -> SolverConfig:
    """Solver with the paper's norm bounds, ``bound_slack`` x the planted norms."""
    return SolverConfig(
        activation=cfg.activation,
        restarts=cfg.restarts,
        max_iter=cfg.max_iter,
        head_bound=cfg.bound_slack * float(model.V.norm(dim=1).max()),
        rep_bound=cfg.bound_slack * float(model.W.norm()),
        seed=seed,
        threads=cfg.threads,
    )


def evaluate(
    predict: Callable[[torch.Tensor, int], torch.Tensor],
    tasks: Sequence[int],
    noisy: TaskData,
    clean: TaskData,
) -> tuple[float, float]:
    """(test risk on noisy labels, excess risk ``E[(f - f*)^2]`` on clean labels: no noise
    sampling error), averaged over ``tasks``; ``predict(X, j)`` predicts the ``j``-th."""

    test, excess = [], []
    with torch.no_grad():
        for j, t in enumerate(tasks):
            pred = predict(noisy.X[t], j)
            test.append(float(((pred - noisy.y[t]) ** 2).mean()))
            excess.append(float(((pred - clean.y[t]) ** 2).mean()))
    return mean(test), mean(excess)


def curve_row(
    cfg: PlantedConfig,
    model: PlantedModel,
    rep: int,
    setting: str,
    r_frz: int,
    r_new: int,
    n: int,
    train_loss: float,
    risks: tuple[float, float],
    start: float,
) -> dict[str, Any]:
    """The CSV row of one solve of a risk curve: ``n`` samples per task, ``r_new`` rows
    learned on ``r_frz`` frozen ones; ``risks`` is (test risk, excess risk), ``start`` the
    solve's ``time.perf_counter()``."""
    return {
        "setting": setting,
        "r_frz": r_frz,
        "r_new": r_new,
        "replicate": rep,
        "N": n,
        "T": model.T,
        "NT": n * model.T,
        "dof": model.T * (r_frz + r_new) + r_new * cfg.d,
        "train_loss": train_loss,
        "test_risk": risks[0],
        "excess_risk": risks[1],
        "noise_floor": model.noise_floor,
        "seconds": time.perf_counter() - start,
    }


def tick(progress: Progress | None) -> None:
    """Report one finished solve to ``progress`` (a progress bar), if any."""
    if progress is not None:
        progress(1)


def risk_curve(
    cfg: SampleComplexityConfig | MismatchConfig,
    rep: int,
    data: Replicate,
    setting: str,
    W_frz: torch.Tensor | None,
    r_new: int,
    seed: tuple[Any, ...],
    progress: Progress | None,
) -> list[dict[str, Any]]:
    """A risk curve of replicate ``rep``: per N of ``cfg.ns``, ``r_new`` rows and the heads
    solved on the first N training samples of each task on top of ``W_frz`` (None: from
    scratch), the solver seeded by ``seed`` and N; its :func:`curve_row` and ``restart``."""
    model, train, test, test_clean = data
    r_frz = 0 if W_frz is None else W_frz.shape[0]
    rows = []
    for n in sorted(cfg.ns):
        start = time.perf_counter()
        solver = solver_config(cfg, model, derive_seed(*seed, n))
        sol = solve_crl(train.head(n), r_new, W_frz, solver)
        risks = evaluate(sol.predict, list(range(model.T)), test, test_clean)
        row = curve_row(cfg, model, rep, setting, r_frz, r_new, n, sol.train_loss, risks, start)
        rows.append(row | {"restart": sol.restart})
        tick(progress)
    return rows


def band(
    rows: Iterable[dict[str, Any]], x: str, y: str = "excess_risk"
) -> list[tuple[float, float, float, float]]:
    """(x, mean, min, max) of ``y`` over replicates at each value of ``x``, sorted by ``x``."""
    groups: dict[float, list[float]] = defaultdict(list)
    for row in rows:
        groups[float(row[x])].append(float(row[y]))
    return [(k, mean(v), min(v), max(v)) for k, v in sorted(groups.items())]


def mean_curve(
    rows: Iterable[dict[str, Any]], x: str, y: str = "excess_risk"
) -> list[tuple[float, float]]:
    """Mean of ``y`` over replicates at each value of ``x``, sorted by ``x``."""
    return [(k, m) for k, m, _, _ in band(rows, x, y)]
