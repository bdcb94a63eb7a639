"""What a reproduce target is (:class:`Target`): its points at a scale, and how its finished
runs become a table. A point is named ``<target>__<series>__seed<k>``, so that ``espn
reproduce report DIR`` tells from the run directories alone which target and series a run
belongs to; everything else is read from the run's own ``results.json``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from espn.errors import EspnError
from espn.registry import Registry
from espn.reproduce.table import Table
from espn.settings.training import default

if TYPE_CHECKING:
    from espn.sweep import Point

SCALES = ("smoke", "cpu", "paper")
SEP = "__"


class ReproduceError(EspnError, ValueError):
    """A reproduce request is not accepted (bad scale, missing data); the message says why."""


@dataclass(frozen=True)
class Options:
    """How to reproduce a target: ``scale`` and its seeds, device and where the data are."""

    scale: str = "smoke"
    seeds: int | None = None  # number of seeds (0..n-1); None: the target's default at scale
    device: str = default("device")
    data_dir: Path | None = None  # dataset root of torchvision's datasets (``--data-dir``)
    data_root: Path | None = None  # table-imagenet: the directory holding the six task folders
    init_weights: Path | None = None  # table-imagenet: a sparse pretrained ResNet50 as task 0
    model: str | None = None  # every point on this model instead of the target's

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ReproduceError(
                f"unknown scale {self.scale!r}; choose one of: {', '.join(SCALES)}"
            )
        if self.seeds is not None and not 1 <= self.seeds <= 1000:
            raise ReproduceError(f"seeds must be a count in [1, 1000], got {self.seeds}")

    def common(self) -> dict[str, Any]:
        """Options every point of every target takes from the user."""
        extra: dict[str, Any] = {"device": self.device}
        if self.data_dir is not None:
            extra["data_dir"] = str(self.data_dir)
        if self.model is not None:
            extra["model"] = self.model
        return extra


@dataclass(frozen=True)
class Run:
    """A finished point: its name's target, series and seed, and its ``results.json``."""

    name: str
    series: str
    seed: int
    doc: dict[str, Any]
    complete: bool = True  # False: the run stopped early (only targets with partial=True)


def point_name(target: str, series: str, seed: int) -> str:
    """``<target>__<series>__seed<k>``: the point's run directory under ``OUT``."""
    if SEP in series:
        raise ValueError(f"series {series!r} must not contain {SEP!r}")
    return f"{target}{SEP}{series}{SEP}seed{seed}"


def parse_name(name: str) -> tuple[str, str, int] | None:
    """The (target, series, seed) of a point name, or None for any other directory."""
    parts = name.split(SEP)
    if len(parts) != 3 or not parts[2].startswith("seed") or not parts[2][4:].isdigit():
        return None
    return parts[0], parts[1], int(parts[2][4:])


@dataclass(frozen=True)
class Target:
    """One table or figure of the paper.

    ``stages(options, out)`` gives the sweep points, stage by stage (a stage's points may
    start from the runs of earlier stages); ``table(runs)`` aggregates the finished runs
    (any order) into the table; ``plot(table, path)`` draws the figure from the table alone.
    ``cost`` says, per scale, what a run of the target costs. ``partial`` targets also
    aggregate runs that stopped before their last task (e.g. out of capacity), from the tasks
    they finished; the others list such runs as incomplete.
    """

    name: str
    title: str
    default_seeds: dict[str, int]
    stages: Callable[[Options, Path], list[list[Point]]]
    table: Callable[[list[Run]], Table]
    plot: Callable[[Table, Path], None]
    cost: dict[str, str]
    partial: bool = False

    def seeds(self, options: Options) -> list[int]:
        """The seeds to run: ``options.seeds`` or the target's default at the scale."""
        return list(range(options.seeds or self.default_seeds[options.scale]))

    def point(self, given: Options, series: str, seed: int, options: dict[str, Any]) -> Point:
        """The sweep point of ``series`` and ``seed``, named by :func:`point_name`: ``options``
        with what the user ``given`` for every point (:meth:`Options.common`) and the seed."""
        from espn.sweep import Point

        return Point(point_name(self.name, series, seed), options | given.common() | {"seed": seed})


TARGETS: Registry[Target] = Registry("target")
