"""What a run can be told, declared once and torch-free: the training settings and their
precedence (:mod:`~espn.settings.training`), a method's own options
(:mod:`~espn.settings.options`), the recipes that set them (:mod:`~espn.settings.recipes`)
and presets read from files (:mod:`espn.settings.presets`).
"""
