"""The three theory-lab experiments: rows for a CSV, and summaries computed from it.

* :func:`run_sample_complexity` -- excess risk against ``N*T`` with frozen features
  (several ``r_frz``) and from scratch; the paper's Corollary 1 says the excess risk
  is governed by ``dof / (N*T)`` with ``dof = T*r + r_new*d``.
* :func:`run_mismatch` -- a perturbed ``W_frz``: the excess risk levels off at the
  mismatch ``MM = L*_frz - L*`` (measured by a separate large-sample solve on clean
  labels) instead of going to 0; learning from scratch eventually goes below it.
* :func:`run_task_order` -- the sequential variant (CRL-SEQ) with sample sizes that
  fall geometrically over the task IDs, trained large-first, small-first and
  individually (from scratch), as in the paper's figure on sample size.

Each ``run_*`` returns one dict per solve (the CSV rows); each ``summarize_*`` works
on rows read back from the CSV, so a summary can be recomputed from the file alone.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
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
    generator,
)
from espn.theory.solver import SolverConfig, solve_crl, solve_sequential
from espn.utils.io import read_csv as io_read_csv

Progress = Callable[[int], None]

SAMPLE_COMPLEXITY_COLUMNS = (
    "setting",
    "r_frz",
    "r_new",
    "replicate",
    "N",
    "T",
    "NT",
    "dof",
    "train_loss",
    "test_risk",
    "excess_risk",
    "noise_floor",
    "restart",
    "seconds",
)
MISMATCH_COLUMNS = (
    "setting",
    "perturbation",
    "r_frz",
    "r_new",
    "replicate",
    "N",
    "T",
    "NT",
    "dof",
    "train_loss",
    "test_risk",
    "excess_risk",
    "noise_floor",
    "seconds",
)
TASK_ORDER_COLUMNS = (
    "order",
    "replicate",
    "task_id",
    "position",
    "N",
    "heads",
    "rows",
    "new_rows",
    "train_loss",
    "test_risk",
    "excess_risk",
    "noise_floor",
)
TASK_ORDERS = ("decreasing", "increasing", "individual")


# ----------------------------------------------------------------------------- configs


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
        _at_least("--threads", self.threads, 0)
        check_choice("--activation", self.activation, tuple(ACTIVATIONS))
        check_choice("--inputs", self.inputs, INPUT_DISTRIBUTIONS)
        _at_least("--d", self.d, 1)
        if not 1 <= self.r <= self.d:
            raise TheoryConfigError(f"--r: must be in [1, d={self.d}], got {self.r}")
        _at_least("--tasks", self.tasks, 1)
        _at_least("--replicates", self.replicates, 1)
        _at_least("--n-test", self.n_test, 1)
        _at_least("--restarts", self.restarts, 1)
        _at_least("--max-iter", self.max_iter, 1)
        if not self.noise >= 0:
            raise TheoryConfigError(f"--noise: must be >= 0, got {self.noise:g}")
        if not self.head_norm > 0:
            raise TheoryConfigError(f"--head-norm: must be > 0, got {self.head_norm:g}")
        if not self.bound_slack > 0:
            raise TheoryConfigError(f"--bound-slack: must be > 0, got {self.bound_slack:g}")

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


@dataclass
class SampleComplexityConfig(PlantedConfig):
    """Sample complexity: scratch and frozen (each ``r_frz``) over per-task sizes ``ns``."""

    r_frz: tuple[int, ...] = (4, 7)
    ns: tuple[int, ...] = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
    target: float = 0.01

    def validate(self) -> None:
        """Raise :class:`TheoryConfigError` naming the first bad value."""
        super().validate()
        _check_ns(self.ns)
        _check_r_frz(self.r_frz, self.r)
        _check_target(self.target)

    @property
    def settings(self) -> list[int]:
        """``r_frz`` of each setting: 0 (from scratch) first, then the frozen ones."""
        return [0, *sorted(set(self.r_frz) - {0})]


@dataclass
class MismatchConfig(PlantedConfig):
    """Mismatch: frozen rows perturbed by each of ``perturbations``, plus scratch."""

    r_frz: int = 6
    r_new: int | None = None
    perturbations: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5)
    ns: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    mm_n: int = 2000
    include_scratch: bool = True

    def validate(self) -> None:
        """Raise :class:`TheoryConfigError` naming the first bad value."""
        super().validate()
        _check_ns(self.ns)
        _check_r_frz((self.r_frz,), self.r)
        if self.r_new is not None and not 0 <= self.r_new <= self.r - self.r_frz:
            raise TheoryConfigError(
                f"--r-new: must be in [0, r - r_frz = {self.r - self.r_frz}], got {self.r_new}"
            )
        if self.r_frz + self.learned_rows < 1:
            raise TheoryConfigError("--r-frz/--r-new: the representation needs at least one row")
        if not self.perturbations:
            raise TheoryConfigError("--perturbations: give at least one value >= 0")
        bad = [p for p in self.perturbations if not p >= 0]
        if bad:
            raise TheoryConfigError(f"--perturbations: every value must be >= 0, got {bad[0]:g}")
        _at_least("--mm-n", self.mm_n, 1)

    @property
    def learned_rows(self) -> int:
        """Rows the learner adds on top of the frozen ones (default ``r - r_frz``)."""
        return self.r - self.r_frz if self.r_new is None else self.r_new


@dataclass
class TaskOrderConfig(PlantedConfig):
    """Task order: ``arrivals`` multi-head tasks with sizes falling from n_max to n_min."""

    d: int = 30
    r: int = 4
    tasks: int = 10
    activation: str = "relu"
    heads: int = 4
    n_max: int = 1000
    n_min: int = 50
    first_rows: int | None = None
    rows_per_task: int = 1
    n_test: int = 1000
    orders: tuple[str, ...] = field(default=TASK_ORDERS)

    def validate(self) -> None:
        """Raise :class:`TheoryConfigError` naming the first bad value."""
        super().validate()
        _at_least("--heads", self.heads, 1)
        _at_least("--n-min", self.n_min, 1)
        if self.n_max < self.n_min:
            raise TheoryConfigError(f"--n-max: must be >= --n-min ({self.n_min}), got {self.n_max}")
        if self.first_rows is not None:
            _at_least("--first-rows", self.first_rows, 1)
        _at_least("--rows-per-task", self.rows_per_task, 0)
        for order in self.orders:
            check_choice("--orders", order, TASK_ORDERS)

    @property
    def sizes(self) -> list[int]:
        """Per-head sample size of task ID i: floor(n_max * (n_min/n_max)^((i-1)/(A-1)))."""
        if self.tasks == 1:
            return [self.n_max]
        ratio = self.n_min / self.n_max
        return [
            max(self.n_min, math.floor(self.n_max * ratio ** (i / (self.tasks - 1)) + 1e-9))
            for i in range(self.tasks)
        ]

    @property
    def rows_first(self) -> int:
        """New rows of the first arrival (default ``r``: room for a full representation)."""
        return self.r if self.first_rows is None else self.first_rows


def _at_least(option: str, value: int, low: int) -> None:
    if value < low:
        raise TheoryConfigError(f"{option}: must be >= {low}, got {value}")


def _check_ns(ns: Sequence[int]) -> None:
    if not ns:
        raise TheoryConfigError("--ns: give at least one sample size N >= 1")
    bad = [n for n in ns if n < 1]
    if bad:
        raise TheoryConfigError(f"--ns: every N must be >= 1, got {bad[0]}")


def _check_r_frz(values: Iterable[int], r: int) -> None:
    for value in values:
        if not 0 <= value <= r:
            raise TheoryConfigError(f"--r-frz: each value must be in [0, r={r}], got {value}")


def _check_target(target: float) -> None:
    if not 0 < target < 1:
        raise TheoryConfigError(f"--target: must be in (0, 1), got {target:g}")


# ----------------------------------------------------------------------------- evaluation


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


def _tick(progress: Progress | None) -> None:
    if progress is not None:
        progress(1)


# ----------------------------------------------------------------------------- sample complexity


def sample_complexity_solves(cfg: SampleComplexityConfig) -> int:
    """Number of solves :func:`run_sample_complexity` makes (for a progress bar)."""
    return cfg.replicates * len(cfg.settings) * len(cfg.ns)


def run_sample_complexity(
    cfg: SampleComplexityConfig, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """Solve CRL for every replicate, setting (scratch / each ``r_frz``) and ``N``.

    Within a replicate all settings see the same planted model, the same test set and
    nested training sets (the first ``N`` samples of one draw), so the curves are
    paired and differences between settings are not sampling noise.
    """
    cfg.validate()
    rows: list[dict[str, Any]] = []
    for rep in range(cfg.replicates):
        model = cfg.model(rep)
        train, _ = model.sample(max(cfg.ns), generator(cfg.seed, "train", rep))
        test, test_clean = model.sample(cfg.n_test, generator(cfg.seed, "test", rep))
        tasks = list(range(model.T))
        for r_frz in cfg.settings:
            r_new = cfg.r - r_frz
            W_frz = model.frozen(r_frz)
            for n in sorted(cfg.ns):
                start = time.perf_counter()
                solver = cfg.solver(model, derive_seed(cfg.seed, rep, r_frz, n))
                sol = solve_crl(train.head(n), r_new, W_frz, solver)
                test_risk, excess = evaluate(sol.predict, tasks, test, test_clean)
                rows.append(
                    {
                        "setting": "scratch" if r_frz == 0 else "frozen",
                        "r_frz": r_frz,
                        "r_new": r_new,
                        "replicate": rep,
                        "N": n,
                        "T": model.T,
                        "NT": n * model.T,
                        "dof": model.T * cfg.r + r_new * cfg.d,
                        "train_loss": sol.train_loss,
                        "test_risk": test_risk,
                        "excess_risk": excess,
                        "noise_floor": model.noise_floor,
                        "restart": sol.restart,
                        "seconds": time.perf_counter() - start,
                    }
                )
                _tick(progress)
    return rows


def _curve(
    rows: Iterable[dict[str, Any]], x: str, y: str = "excess_risk"
) -> list[tuple[float, float]]:
    """Mean of ``y`` over replicates at each value of ``x``, sorted by ``x``."""
    groups: dict[float, list[float]] = defaultdict(list)
    for row in rows:
        groups[float(row[x])].append(float(row[y]))
    return sorted((k, mean(v)) for k, v in groups.items())


def crossing(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """First ``x`` where the curve reaches ``target`` (log-log interpolation), else None.

    Returns the first grid point itself when the curve starts at or below ``target``.
    """
    for i, (x, y) in enumerate(curve):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = curve[i - 1]
            if y0 <= 0 or y <= 0 or y0 == y:
                return x
            frac = (math.log(y0) - math.log(target)) / (math.log(y0) - math.log(y))
            return math.exp(math.log(x0) + frac * (math.log(x) - math.log(x0)))
    return None


def fit_rate_constant(rows: Iterable[dict[str, Any]]) -> float:
    """``c`` of the prediction ``excess ~ c * dof / (N*T)``, fitted in log space.

    One constant for all settings, over the points with ``N*T >= dof`` (below that
    the problem is under-determined and no rate applies).  ``c`` is the only free
    number: the shape and the spacing between the settings come from ``dof``.
    """
    logs = [
        math.log(float(r["excess_risk"])) - math.log(float(r["dof"]) / float(r["NT"]))
        for r in rows
        if float(r["NT"]) >= float(r["dof"]) and float(r["excess_risk"]) > 0
    ]
    return math.exp(mean(logs)) if logs else float("nan")


def summarize_sample_complexity(
    rows: Sequence[dict[str, Any]], target: float = 0.01
) -> dict[str, Any]:
    """N*T needed to reach ``target`` excess risk per setting, against the bound.

    The bound depends on the data only through ``dof / (N*T)``, so whatever its
    constant, the N*T needed for a given excess risk is proportional to ``dof``: the
    constant-free prediction is ``NT_scratch / NT_frozen = dof_scratch / dof_frozen``.
    """
    c = fit_rate_constant(rows)
    by_setting: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_setting[int(row["r_frz"])].append(row)
    settings = []
    for r_frz in sorted(by_setting):
        group = by_setting[r_frz]
        curve = _curve(group, "NT")
        dof = float(group[0]["dof"])
        settings.append(
            {
                "setting": "scratch" if r_frz == 0 else f"frozen r_frz={r_frz}",
                "r_frz": r_frz,
                "r_new": int(group[0]["r_new"]),
                "dof": dof,
                "nt_needed": crossing(curve, target),
                "nt_predicted": c * dof / target,
                "excess_at_max_nt": curve[-1][1],
                "max_nt": curve[-1][0],
            }
        )
    scratch = next((s for s in settings if s["r_frz"] == 0), None)
    for s in settings:
        if scratch is None:
            s["ratio_measured"] = s["ratio_predicted"] = s["excess_ratio_at_max_nt"] = None
            continue
        s["ratio_predicted"] = scratch["dof"] / s["dof"]
        both = scratch["nt_needed"] is not None and s["nt_needed"] is not None
        s["ratio_measured"] = scratch["nt_needed"] / s["nt_needed"] if both else None
        # at a fixed N*T in the asymptotic regime the bound says excess is ~ dof
        same_nt = scratch["max_nt"] == s["max_nt"] and s["excess_at_max_nt"] > 0
        s["excess_ratio_at_max_nt"] = (
            scratch["excess_at_max_nt"] / s["excess_at_max_nt"] if same_nt else None
        )
    return {"target": target, "rate_constant": c, "settings": settings}


# ----------------------------------------------------------------------------- mismatch


def mismatch_solves(cfg: MismatchConfig) -> int:
    """Number of solves :func:`run_mismatch` makes (for a progress bar)."""
    curves = len(cfg.perturbations) + int(cfg.include_scratch)
    return cfg.replicates * (curves * len(cfg.ns) + len(cfg.perturbations))


def run_mismatch(cfg: MismatchConfig, progress: Progress | None = None) -> list[dict[str, Any]]:
    """Frozen rows perturbed by each ``eps``: risk curves and the mismatch MM itself.

    MM = L*_frz - L* is the smallest population excess risk reachable on top of the
    perturbed ``W_frz``; it is measured by solving the same problem on ``mm_n`` clean
    samples per task (``setting = "mm-train"``: in-sample loss, a slight
    under-estimate; ``"mm-test"``: on the clean test set, a slight over-estimate).
    """
    cfg.validate()
    rows: list[dict[str, Any]] = []
    r_new = cfg.learned_rows
    for rep in range(cfg.replicates):
        model = cfg.model(rep)
        train, _ = model.sample(max(cfg.ns), generator(cfg.seed, "train", rep))
        test, test_clean = model.sample(cfg.n_test, generator(cfg.seed, "test", rep))
        tasks = list(range(model.T))
        base = {"T": model.T, "replicate": rep, "noise_floor": model.noise_floor}
        for eps in cfg.perturbations:
            W_frz = model.frozen(cfg.r_frz, eps, seed=derive_seed(cfg.seed, "perturb", rep))
            # the mismatch: a large noise-free solve on top of the perturbed rows
            start = time.perf_counter()
            _, mm_clean = model.sample(cfg.mm_n, generator(cfg.seed, "mm", rep, eps))
            sol = solve_crl(mm_clean, r_new, W_frz, cfg.solver(model, derive_seed(rep, eps)))
            _, mm_test = evaluate(sol.predict, tasks, test, test_clean)
            seconds = time.perf_counter() - start
            common = {
                **base,
                "perturbation": eps,
                "r_frz": cfg.r_frz,
                "r_new": r_new,
                "N": cfg.mm_n,
                "NT": cfg.mm_n * model.T,
                "dof": model.T * (cfg.r_frz + r_new) + r_new * cfg.d,
                "seconds": seconds,
            }
            for setting, value in (("mm-train", sol.train_loss), ("mm-test", mm_test)):
                rows.append(
                    {
                        **common,
                        "setting": setting,
                        "train_loss": sol.train_loss,
                        "test_risk": value + model.noise_floor,
                        "excess_risk": value,
                    }
                )
            _tick(progress)
            rows.extend(
                _risk_curve(cfg, rep, model, train, (test, test_clean), W_frz, r_new, eps, progress)
            )
        if cfg.include_scratch:
            rows.extend(
                _risk_curve(
                    cfg, rep, model, train, (test, test_clean), None, cfg.r, math.nan, progress
                )
            )
    return rows


def _risk_curve(
    cfg: MismatchConfig,
    rep: int,
    model: PlantedModel,
    train: TaskData,
    tests: tuple[TaskData, TaskData],
    W_frz: torch.Tensor | None,
    r_new: int,
    eps: float,
    progress: Progress | None,
) -> list[dict[str, Any]]:
    """Excess risk over ``cfg.ns`` on top of ``W_frz`` (``None``: from scratch)."""
    rows = []
    test, test_clean = tests
    setting = "scratch" if W_frz is None else "frozen"
    r_frz = 0 if W_frz is None else W_frz.shape[0]
    for n in sorted(cfg.ns):
        start = time.perf_counter()
        seed = derive_seed(cfg.seed, rep, setting, eps, n)
        sol = solve_crl(train.head(n), r_new, W_frz, cfg.solver(model, seed))
        test_risk, excess = evaluate(sol.predict, list(range(model.T)), test, test_clean)
        rows.append(
            {
                "setting": setting,
                "perturbation": eps,
                "r_frz": r_frz,
                "r_new": r_new,
                "replicate": rep,
                "N": n,
                "T": model.T,
                "NT": n * model.T,
                "dof": model.T * (r_frz + r_new) + r_new * cfg.d,
                "train_loss": sol.train_loss,
                "test_risk": test_risk,
                "excess_risk": excess,
                "noise_floor": model.noise_floor,
                "seconds": time.perf_counter() - start,
            }
        )
        _tick(progress)
    return rows


def summarize_mismatch(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per perturbation: MM (mean over replicates) next to the frozen risk's floor.

    The floor is the frozen-feature excess risk at the largest ``N*T``; the theory
    says it approaches MM from above (never below, up to evaluation noise), while
    learning from scratch keeps falling towards 0.
    """
    out = []
    perts = sorted({float(r["perturbation"]) for r in rows if r["setting"] == "frozen"})
    for eps in perts:

        def pick(setting: str, eps: float = eps) -> list[dict[str, Any]]:
            return [r for r in rows if r["setting"] == setting and float(r["perturbation"]) == eps]

        curve = _curve(pick("frozen"), "NT")
        mm_test = mean(float(r["excess_risk"]) for r in pick("mm-test"))
        mm_train = mean(float(r["excess_risk"]) for r in pick("mm-train"))
        out.append(
            {
                "perturbation": eps,
                "mm_train": mm_train,
                "mm_test": mm_test,
                "floor": curve[-1][1],
                "min_excess": min(y for _, y in curve),
                "floor_over_mm": curve[-1][1] / mm_test if mm_test > 1e-6 else None,
                "max_nt": curve[-1][0],
            }
        )
    scratch = [r for r in rows if r["setting"] == "scratch"]
    scratch_curve = _curve(scratch, "NT") if scratch else []
    noise = mean(float(r["noise_floor"]) for r in rows)
    return {
        "noise_floor": noise,
        "perturbations": out,
        "scratch_at_max_nt": scratch_curve[-1][1] if scratch_curve else None,
        "scratch_curve": scratch_curve,
    }


# ----------------------------------------------------------------------------- task order


def task_order_solves(cfg: TaskOrderConfig) -> int:
    """Number of solves :func:`run_task_order` makes (for a progress bar)."""
    return cfg.replicates * cfg.tasks * len(cfg.orders)


def run_task_order(cfg: TaskOrderConfig, progress: Progress | None = None) -> list[dict[str, Any]]:
    """Sequential CRL with falling sample sizes, in decreasing and increasing order.

    Task ID ``i`` (1 = largest) has ``heads`` planted heads with ``sizes[i-1]`` samples
    each; all tasks share ``W*``.  An arrival adds ``first_rows`` rows if it is the
    first and ``rows_per_task`` rows otherwise (the first task can build a full
    representation, later ones extend it a little, like ESPN's weight budget).
    ``individual`` learns each task alone from scratch with ``first_rows`` rows.
    """
    cfg.validate()
    rows: list[dict[str, Any]] = []
    sizes = cfg.sizes
    groups = [list(range(i * cfg.heads, (i + 1) * cfg.heads)) for i in range(cfg.tasks)]
    new_rows = [cfg.rows_first] + [cfg.rows_per_task] * (cfg.tasks - 1)
    for rep in range(cfg.replicates):
        model = cfg.model(rep, tasks=cfg.tasks * cfg.heads)
        per_head = [n for n in sizes for _ in range(cfg.heads)]
        train, _ = model.sample(per_head, generator(cfg.seed, "train", rep))
        test, test_clean = model.sample(cfg.n_test, generator(cfg.seed, "test", rep))
        base = {"replicate": rep, "heads": cfg.heads, "noise_floor": model.noise_floor}
        for order in cfg.orders:
            solver = cfg.solver(model, derive_seed(cfg.seed, rep, order))
            if order == "individual":
                for i, group in enumerate(groups):
                    sol = solve_crl(train.select(group), cfg.rows_first, None, solver)
                    test_risk, excess = evaluate(sol.predict, group, test, test_clean)
                    rows.append(
                        {
                            **base,
                            "order": order,
                            "task_id": i + 1,
                            "position": 1,
                            "N": sizes[i],
                            "rows": cfg.rows_first,
                            "new_rows": cfg.rows_first,
                            "train_loss": sol.train_loss,
                            "test_risk": test_risk,
                            "excess_risk": excess,
                        }
                    )
                    _tick(progress)
                continue
            ids = list(range(cfg.tasks)) if order == "decreasing" else list(range(cfg.tasks))[::-1]
            result = solve_sequential(
                train,
                [groups[i] for i in ids],
                new_rows,
                None,
                solver,
                on_arrival=(lambda _step: _tick(progress)),
            )
            for position, i in enumerate(ids, start=1):
                group = groups[i]
                test_risk, excess = evaluate(
                    lambda X, j, group=group, result=result: result.predict(X, group[j]),
                    group,
                    test,
                    test_clean,
                )
                rows.append(
                    {
                        **base,
                        "order": order,
                        "task_id": i + 1,
                        "position": position,
                        "N": sizes[i],
                        "rows": result.W[group[0]].shape[0],
                        "new_rows": new_rows[position - 1],
                        "train_loss": mean(result.train_loss[t] for t in group),
                        "test_risk": test_risk,
                        "excess_risk": excess,
                    }
                )
    return rows


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
                "per_task_excess": [p[1] for p in _curve(group, "task_id")],
            }
        )
    return {
        "task_ids": ids,
        "sizes": [int(next(r["N"] for r in rows if int(r["task_id"]) == i)) for i in ids],
        "noise_floor": mean(float(r["noise_floor"]) for r in rows),
        "orders": orders,
    }


# ----------------------------------------------------------------------------- files


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV written by :func:`espn.utils.io.write_csv`, numbers parsed back to int/float."""
    return [{k: _parse(v) for k, v in row.items()} for row in io_read_csv(path)]


def _parse(text: str) -> Any:
    """A CSV cell as int, else float, else the text itself."""
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def _check_finite(cfg: PlantedConfig) -> None:
    """Every float option (and every number of a list option) must be finite."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        for x in value if isinstance(value, tuple) else (value,):
            if isinstance(x, float) and not math.isfinite(x):
                option = "--" + f.name.replace("_", "-")
                raise TheoryConfigError(f"{option}: must be a finite number, got {x:g}")


def config_dict(cfg: PlantedConfig) -> dict[str, Any]:
    """The configuration as plain JSON-able data (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}
