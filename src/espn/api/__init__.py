"""The front door: the :class:`~espn.api.learner.ContinualLearner` (its run directory in
:mod:`~espn.api.run_directory`, its learned tasks in :mod:`~espn.api.tasks`, its argument
checks in :mod:`~espn.api.checks`), the one-call functions ``espn.run``/``wrap``/``load``
(:mod:`~espn.api.functions`), ``espn run``'s experiment (:mod:`~espn.api.experiment`) and
the names espn knows (:mod:`~espn.api.catalog`). ``import espn`` exports them lazily.
"""
