"""Continual-learning methods as strategies over one engine, found by name in METHODS.

Every module of this package is imported here, so that a method's own file is all it takes to
add one: its ``@METHODS.register`` and its declared options (``Strategy.options``) take effect.
"""

import importlib
import pkgutil

from espn.methods.base import METHODS, MethodConfig, Phase, Strategy
from espn.settings.options import Option

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["METHODS", "MethodConfig", "Option", "Phase", "Strategy"]
