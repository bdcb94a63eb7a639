"""A run as the assembly side knows it: its configuration (:mod:`~espn.runs.config`,
:class:`~espn.runs.config.RunConfig`), the checks made before work
(:mod:`~espn.runs.preflight`), a method built from settings (:mod:`~espn.runs.method`)
(``espn run``, the learner's ``out=``, ``espn show/evaluate/export``); the checks that a run directory may be written or resumed
(:mod:`~espn.runs.checks`), loading a finished run into a rebuilt supernet
(:mod:`~espn.runs.loading`), continuing the task in training of a killed run
(:mod:`~espn.runs.training`), learning on top of another run (:mod:`~espn.runs.from_run`)
and the configurations older espn versions saved (:mod:`~espn.runs.legacy`).

:mod:`espn.checkpoint` only reads and writes the files; these modules decide what to build
from them.
"""
