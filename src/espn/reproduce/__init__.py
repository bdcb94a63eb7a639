"""``espn reproduce``: every table and figure of the paper from one command, a target's points
run by :func:`run_target` and its outputs rebuilt by :func:`report` (docs/reproduce.md)."""

from espn.reproduce import continual, pruners, representation, task_order  # noqa: F401  (register targets)
from espn.reproduce.paper import paper_numbers
from espn.reproduce.runner import TargetResult, report, run_target
from espn.reproduce.table import Table
from espn.reproduce.target import SCALES, TARGETS, Options, ReproduceError, Run, Target

__all__ = [
    "SCALES",
    "TARGETS",
    "Options",
    "ReproduceError",
    "Run",
    "Table",
    "Target",
    "TargetResult",
    "paper_numbers",
    "report",
    "run_target",
]
