"""matplotlib on demand: importing it costs about a second, so modules that draw figures
ask for pyplot here, inside the function that plots, instead of importing it at start."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from espn.utils.io import atomic_target

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` with the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_figure(fig: Figure, path: Path, dpi: int = 110, **options: Any) -> Path:
    """Lay ``fig`` out tightly, write it atomically in the format of ``path``'s suffix (PNG
    without one) with matplotlib's ``savefig`` ``options``, and close it; ``path``."""
    fig.tight_layout()
    with atomic_target(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png", **options)
    pyplot().close(fig)
    return path
