"""Theory lab: the paper's shallow-network model of continual representation learning.

Runnable, CPU-only experiments for the section "Application to Shallow Networks"
(Corollary 1) and the sequential analysis (CRL-SEQ):

* :mod:`espn.theory.planted` -- the planted model ``y = sigma(v_t^T psi(W* x)) + Z``
  and frozen representations with or without mismatch;
* :mod:`espn.theory.solver` -- the CRL solver (jointly over T tasks, on top of frozen
  rows or from scratch) and its sequential variant;
* :mod:`espn.theory.config` -- what each experiment accepts and writes (settings, their
  validation, CSV columns), without torch, so that the command line refuses at once;
* :mod:`espn.theory.sample_complexity`, :mod:`espn.theory.mismatch`,
  :mod:`espn.theory.task_order` -- the three experiments, each producing CSV rows and a
  summary computed from them (what they share: :mod:`espn.theory.common`);
* :mod:`espn.theory.plots` / :mod:`espn.theory.report` -- figures and text tables.

The command line is ``espn theory sample-complexity | mismatch | task-order | report``.
"""
