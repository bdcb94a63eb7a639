"""matplotlib on demand: importing it costs about a second, so modules that draw figures
ask for pyplot here, inside the function that plots, instead of importing it at start."""

from __future__ import annotations

from types import ModuleType


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` with the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
