"""espn: Efficient Sparse PackNet, zero-forgetting and inference-efficient continual learning.

What a user reaches for first, all importable from ``espn``:

- :func:`run`: a whole run as ``espn run`` makes it (benchmark, model, method, options by
  keyword or as a :class:`~espn.runs.config.RunConfig`), returning its ``results.json`` document;
- :func:`wrap` your own model, :class:`ContinualLearner` to learn tasks from your own data
  (``learn``, ``evaluate``, ``accuracy_matrix``, ``report``, ``export``, ``save``), and
  :func:`load` to read a saved run back (see :mod:`espn.api.functions`);
- :func:`create_method`: a continual-learning method by name with its settings;
- :func:`list_benchmarks`, :func:`list_models`, :func:`list_methods`, :func:`list_pruners`:
  the names those accept;
- :func:`fashion_mnist`: Fashion-MNIST as tensors from the offline copy on disk
  (:mod:`espn.data`, also reachable as ``espn.data`` after ``import espn``);
- :class:`EspnError`: the base of every error a user can fix (``except espn.EspnError``).

Everything is imported on first use, so ``import espn`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from espn._version import __version__

if TYPE_CHECKING:
    from espn.api.catalog import list_benchmarks, list_methods, list_models, list_pruners
    from espn.api.experiment import run
    from espn.api.functions import ContinualLearner, load, wrap
    from espn.data.offline import fashion_mnist
    from espn.errors import EspnError
    from espn.runs.method import create_method
    from espn.supernet.supernet import Supernet

#: each name of the front door -> the module that defines it
_HOMES = {
    "ContinualLearner": "espn.api.functions",
    "EspnError": "espn.errors",
    "load": "espn.api.functions",
    "wrap": "espn.api.functions",
    "Supernet": "espn.supernet.supernet",
    "run": "espn.api.experiment",
    "create_method": "espn.runs.method",
    "fashion_mnist": "espn.data.offline",
    "list_benchmarks": "espn.api.catalog",
    "list_methods": "espn.api.catalog",
    "list_models": "espn.api.catalog",
    "list_pruners": "espn.api.catalog",
}

__all__ = [
    "ContinualLearner",
    "EspnError",
    "Supernet",
    "__version__",
    "create_method",
    "fashion_mnist",
    "list_benchmarks",
    "list_methods",
    "list_models",
    "list_pruners",
    "load",
    "run",
    "wrap",
]


def __getattr__(name: str) -> Any:
    """The front door, imported on first use (``import espn.cli`` stays light)."""
    if name == "data":  # the subpackage, for ``espn.data.fashion_mnist`` after ``import espn``
        return importlib.import_module("espn.data")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'espn' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
