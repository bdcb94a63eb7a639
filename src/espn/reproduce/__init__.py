"""``espn reproduce``: every table and figure of the paper from one command (docs/reproduce.md).

A target (``TARGETS``) is a list of sweep points at a scale and a way to aggregate their runs;
:func:`run_target` runs the points and writes ``OUT/TARGET.csv``, ``.md`` and ``.png``;
:func:`report` rebuilds them from the run directories alone.
"""

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
