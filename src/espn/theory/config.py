"""What each theory-lab experiment accepts and writes: its settings with their validation, the
accepted choices and its CSV columns; without torch, so that the command line refuses a bad
value at once."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from espn.errors import EspnError

#: the activations psi of the planted model and the solver
ACTIVATIONS = ("identity", "relu")
INPUT_DISTRIBUTIONS = ("sphere", "ball")
TASK_ORDERS = ("decreasing", "increasing", "individual")


class TheoryConfigError(EspnError, ValueError):
    """A theory-lab setting is not accepted: ``"<parameter>: <reason>"`` (``parameter`` as the
    library calls it, ``r_frz``, or None; the command line puts its option, ``--r-frz``)."""

    def __init__(self, reason: str, parameter: str | None = None) -> None:
        super().__init__(f"{parameter}: {reason}" if parameter else reason)
        self.reason = reason
        self.parameter = parameter


def check_choice(parameter: str, value: str, accepted: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``accepted``, else raise a clear error."""
    if value not in accepted:
        raise TheoryConfigError(f"got {value!r}; accepted: {', '.join(accepted)}", parameter)
    return value


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
        for f in fields(self):  # every float, and every number of a list, must be finite
            value = getattr(self, f.name)
            for x in value if isinstance(value, tuple) else (value,):
                if isinstance(x, float) and not math.isfinite(x):
                    raise TheoryConfigError(f"must be a finite number, got {x:g}", f.name)
        at_least("threads", self.threads, 0)
        check_choice("activation", self.activation, ACTIVATIONS)
        check_choice("inputs", self.inputs, INPUT_DISTRIBUTIONS)
        at_least("d", self.d, 1)
        if not 1 <= self.r <= self.d:
            raise TheoryConfigError(f"must be in [1, d={self.d}], got {self.r}", "r")
        for name in ("tasks", "replicates", "n_test", "restarts", "max_iter"):
            at_least(name, getattr(self, name), 1)
        if not self.noise >= 0:
            raise TheoryConfigError(f"must be >= 0, got {self.noise:g}", "noise")
        for name in ("head_norm", "bound_slack"):
            if not getattr(self, name) > 0:
                raise TheoryConfigError(f"must be > 0, got {getattr(self, name):g}", name)

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain JSON-able data (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


#: the columns of a risk curve's row (:func:`espn.theory.common.curve_row`)
CURVE_COLUMNS = (
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
)
#: the columns of each experiment's CSV, by the stem of its files
COLUMNS: dict[str, tuple[str, ...]] = {
    "sample_complexity": ("setting", *CURVE_COLUMNS, "restart", "seconds"),
    "mismatch": ("setting", "perturbation", *CURVE_COLUMNS, "seconds"),
    "task_order": (
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
    ),
}


@dataclass
class SampleComplexityConfig(PlantedConfig):
    """Sample complexity: scratch and frozen (each ``r_frz``) over per-task sizes ``ns``."""

    r_frz: tuple[int, ...] = (4, 7)
    ns: tuple[int, ...] = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
    target: float = 0.01

    def validate(self) -> None:
        """Raise :class:`TheoryConfigError` naming the first bad value."""
        super().validate()
        check_ns(self.ns)
        check_r_frz(self.r_frz, self.r)
        if not 0 < self.target < 1:
            raise TheoryConfigError(f"must be in (0, 1), got {self.target:g}", "target")

    @property
    def settings(self) -> list[int]:
        """``r_frz`` of each setting: 0 (from scratch) first, then the frozen ones."""
        return [0, *sorted(set(self.r_frz) - {0})]

    def solves(self) -> int:
        """Number of solves the experiment makes (for a progress bar)."""
        return self.replicates * len(self.settings) * len(self.ns)


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
        check_ns(self.ns)
        check_r_frz((self.r_frz,), self.r)
        if self.r_new is not None and not 0 <= self.r_new <= self.r - self.r_frz:
            raise TheoryConfigError(
                f"must be in [0, r - r_frz = {self.r - self.r_frz}], got {self.r_new}", "r_new"
            )
        if self.r_frz + self.learned_rows < 1:
            raise TheoryConfigError("the representation needs at least one row", "r_frz/r_new")
        if not self.perturbations:
            raise TheoryConfigError("give at least one value >= 0", "perturbations")
        bad = [p for p in self.perturbations if not p >= 0]
        if bad:
            raise TheoryConfigError(f"every value must be >= 0, got {bad[0]:g}", "perturbations")
        at_least("mm_n", self.mm_n, 1)

    @property
    def learned_rows(self) -> int:
        """Rows the learner adds on top of the frozen ones (default ``r - r_frz``)."""
        return self.r - self.r_frz if self.r_new is None else self.r_new

    def solves(self) -> int:
        """Number of solves the experiment makes (for a progress bar)."""
        curves = len(self.perturbations) + int(self.include_scratch)
        return self.replicates * (curves * len(self.ns) + len(self.perturbations))


@dataclass
class TaskOrderConfig(PlantedConfig):
    """Task order: ``tasks`` multi-head tasks with sizes falling from n_max to n_min."""

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
        at_least("heads", self.heads, 1)
        at_least("n_min", self.n_min, 1)
        if self.n_max < self.n_min:
            raise TheoryConfigError(f"must be >= n_min ({self.n_min}), got {self.n_max}", "n_max")
        if self.first_rows is not None:
            at_least("first_rows", self.first_rows, 1)
        at_least("rows_per_task", self.rows_per_task, 0)
        for order in self.orders:
            check_choice("orders", order, TASK_ORDERS)

    @property
    def sizes(self) -> list[int]:
        """Per-head sample size of task ID i (from 0): floor(n_max * (n_min/n_max)^(i/(A-1)))."""
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

    def solves(self) -> int:
        """Number of solves the experiment makes (for a progress bar)."""
        return self.replicates * self.tasks * len(self.orders)
