"""Summaries over repeated runs (seeds): mean and standard error of the mean, and the
markdown tables that show them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and standard error of the mean (sample std / sqrt(n)); se is None for n < 2."""
    n = len(values)
    if n == 0:
        return None, None
    mean = sum(values) / n
    if n < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def mean_se_cell(value: Any, se: Any) -> str:
    """A table cell: ``–`` for None, a float as ``mean ± se`` (two decimals; ``se`` None: no
    ``±``), anything else as its text."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}" + ("" if se is None else f" ± {se:.2f}")
    return str(value)


def markdown_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a markdown table of ``header`` and the cells of ``rows``."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]
