"""Theory lab: the paper's shallow-network model of continual representation learning.

Runnable, CPU-only experiments for the section "Application to Shallow Networks"
(Corollary 1) and the sequential analysis (CRL-SEQ):

* :mod:`espn.theory.planted` -- the planted model ``y = sigma(v_t^T psi(W* x)) + Z``
  and frozen representations with or without mismatch;
* :mod:`espn.theory.solver` -- the CRL solver (jointly over T tasks, on top of frozen
  rows or from scratch) and its sequential variant;
* :mod:`espn.theory.sample_complexity`, :mod:`espn.theory.mismatch`,
  :mod:`espn.theory.task_order` -- the three experiments, each producing CSV rows and a
  summary computed from them (what they share: :mod:`espn.theory.common`);
* :mod:`espn.theory.plots` / :mod:`espn.theory.report` -- figures and text tables.

The command line is ``espn theory sample-complexity | mismatch | task-order | report``.
"""

from espn.theory.common import read_csv
from espn.theory.mismatch import MismatchConfig, run_mismatch, summarize_mismatch
from espn.theory.planted import PlantedModel, TaskData, TheoryConfigError
from espn.theory.sample_complexity import (
    SampleComplexityConfig,
    run_sample_complexity,
    summarize_sample_complexity,
)
from espn.theory.solver import (
    CRLSolution,
    SequentialResult,
    SolverConfig,
    solve_crl,
    solve_sequential,
)
from espn.theory.task_order import TaskOrderConfig, run_task_order, summarize_task_order

__all__ = [
    "CRLSolution",
    "MismatchConfig",
    "PlantedModel",
    "SampleComplexityConfig",
    "SequentialResult",
    "SolverConfig",
    "TaskData",
    "TaskOrderConfig",
    "TheoryConfigError",
    "read_csv",
    "run_mismatch",
    "run_sample_complexity",
    "run_task_order",
    "solve_crl",
    "solve_sequential",
    "summarize_mismatch",
    "summarize_sample_complexity",
    "summarize_task_order",
]
