"""espn: Efficient Sparse PackNet, zero-forgetting and inference-efficient continual learning.

From Python: ``espn.wrap(model, example_input)`` wraps your model,
``espn.ContinualLearner(supernet, method="espn", gamma=0.2)`` learns tasks from your data
(``learn``, ``evaluate``, ``accuracy_matrix``, ``report``, ``export``, ``save``), and
``espn.load(run_dir)`` reads a saved run (see :mod:`espn.api`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from espn.api import ContinualLearner, load, wrap
    from espn.supernet.supernet import Supernet

__all__ = ["ContinualLearner", "Supernet", "__version__", "load", "wrap"]


def __getattr__(name: str) -> Any:
    """The front door, imported on first use (``import espn.cli`` stays light)."""
    if name in ("ContinualLearner", "Supernet", "load", "wrap"):
        from espn import api

        return getattr(api, name)
    raise AttributeError(f"module 'espn' has no attribute {name!r}")
