"""The front door: :class:`~espn.api.learner.ContinualLearner`, ``espn.run``/``wrap``/``load``,
``espn run``'s experiment and the names espn knows; ``import espn`` exports them lazily."""
