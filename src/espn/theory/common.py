"""What the theory-lab experiments share: the planted-model settings, their validation, the
risk evaluation, the mean curves of the summaries, and reading a CSV back.

The experiments themselves are :mod:`espn.theory.sample_complexity`,
:mod:`espn.theory.mismatch` and :mod:`espn.theory.task_order`: each ``run_*`` returns one
dict per solve (the CSV rows), each ``summarize_*`` works on rows read back from the CSV, so
a summary can be recomputed from the file alone. Errors name the parameters as the library
calls them (``r_frz``); the command line maps them to its options.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from statistics import mean
from typing import Any

import torch

from espn.theory.planted import (
    ACTIVATIONS,
    INPUT_DISTRIBUTIONS,
    PlantedModel,
    TaskData,
    TheoryConfigError,
    check_choice,
    derive_seed,
)
from espn.theory.solver import SolverConfig
from espn.utils.io import read_csv as io_read_csv

Progress = Callable[[int], None]


@dataclass
class PlantedConfig:
    """Settings shared by every experiment: the planted model and the solver."""

    d: int = 40
    r: int = 8
    tasks: int = 8
    activation: str = "identity"
    noise: float = 0.5
    head_norm: float = 2.5
    inputs: str = "sphere"
    replicates: int = 3
    n_test: int = 2000
    restarts: int = 3
    max_iter: int = 300
    bound_slack: float = 1.5
    seed: int = 0
    threads: int = 1

    def validate(self) -> None:
        """Raise :class:`TheoryConfigError` naming the first bad value."""
        _check_finite(self)
        at_least("threads", self.threads, 0)
        check_choice("activation", self.activation, tuple(ACTIVATIONS))
        check_choice("inputs", self.inputs, INPUT_DISTRIBUTIONS)
        at_least("d", self.d, 1)
        if not 1 <= self.r <= self.d:
            raise TheoryConfigError(f"must be in [1, d={self.d}], got {self.r}", "r")
        at_least("tasks", self.tasks, 1)
        at_least("replicates", self.replicates, 1)
        at_least("n_test", self.n_test, 1)
        at_least("restarts", self.restarts, 1)
        at_least("max_iter", self.max_iter, 1)
        if not self.noise >= 0:
            raise TheoryConfigError(f"must be >= 0, got {self.noise:g}", "noise")
        if not self.head_norm > 0:
            raise TheoryConfigError(f"must be > 0, got {self.head_norm:g}", "head_norm")
        if not self.bound_slack > 0:
            raise TheoryConfigError(f"must be > 0, got {self.bound_slack:g}", "bound_slack")

    def model(self, replicate: int, tasks: int | None = None) -> PlantedModel:
        """The planted model of one replicate (its own ``W*`` and heads)."""
        return PlantedModel.create(
            self.d,
            self.r,
            tasks or self.tasks,
            activation=self.activation,
            noise=self.noise,
            head_norm=self.head_norm,
            seed=derive_seed(self.seed, "replicate", replicate),
            inputs=self.inputs,
        )

    def solver(self, model: PlantedModel, seed: int) -> SolverConfig:
        """Solver with the paper's norm bounds, ``bound_slack`` x the planted norms."""
        return SolverConfig(
            activation=self.activation,
            restarts=self.restarts,
            max_iter=self.max_iter,
            head_bound=self.bound_slack * float(model.V.norm(dim=1).max()),
            rep_bound=self.bound_slack * float(model.W.norm()),
            seed=seed,
            threads=self.threads,
        )


def at_least(parameter: str, value: int, low: int) -> None:
    """Refuse an integer setting below ``low``."""
    if value < low:
        raise TheoryConfigError(f"must be >= {low}, got {value}", parameter)


def check_ns(ns: Sequence[int]) -> None:
    """Refuse an empty list of per-task sample sizes or a size below 1."""
    if not ns:
        raise TheoryConfigError("give at least one sample size N >= 1", "ns")
    bad = [n for n in ns if n < 1]
    if bad:
        raise TheoryConfigError(f"every N must be >= 1, got {bad[0]}", "ns")


def check_r_frz(values: Iterable[int], r: int) -> None:
    """Refuse a frozen-row count outside ``[0, r]``."""
    for value in values:
        if not 0 <= value <= r:
            raise TheoryConfigError(f"each value must be in [0, r={r}], got {value}", "r_frz")


def _check_finite(cfg: PlantedConfig) -> None:
    """Every float option (and every number of a list option) must be finite."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        for x in value if isinstance(value, tuple) else (value,):
            if isinstance(x, float) and not math.isfinite(x):
                raise TheoryConfigError(f"must be a finite number, got {x:g}", f.name)


def evaluate(
    predict: Callable[[torch.Tensor, int], torch.Tensor],
    tasks: Sequence[int],
    noisy: TaskData,
    clean: TaskData,
) -> tuple[float, float]:
    """(test risk on noisy labels, excess risk on clean labels), averaged over tasks.

    ``predict(X, j)`` is the prediction for the ``j``-th of ``tasks``, whose test data
    are ``noisy.X[tasks[j]]``.  The excess risk ``E[(f - f*)^2]`` equals the population
    risk minus the noise floor ``E[Z^2]`` exactly; measuring it on clean labels
    removes the noise's sampling error.
    """
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


def mean_curve(
    rows: Iterable[dict[str, Any]], x: str, y: str = "excess_risk"
) -> list[tuple[float, float]]:
    """Mean of ``y`` over replicates at each value of ``x``, sorted by ``x``."""
    groups: dict[float, list[float]] = defaultdict(list)
    for row in rows:
        groups[float(row[x])].append(float(row[y]))
    return sorted((k, mean(v)) for k, v in groups.items())


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV written by :func:`espn.utils.io.write_csv`, numbers parsed back to int/float."""
    return [{k: _parse(v) for k, v in row.items()} for row in io_read_csv(path)]


def _parse(text: str) -> Any:
    """A CSV cell as int, else float, else the text itself."""
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def config_dict(cfg: PlantedConfig) -> dict[str, Any]:
    """The configuration as plain JSON-able data (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}
