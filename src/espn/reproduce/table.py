"""A target's result table: mean and standard error over seeds, as CSV and as markdown.

Columns ending in ``_se`` hold the standard error of the column before them; markdown shows
the pair as ``mean ± se``. Columns starting with ``paper`` hold the paper's reported numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from espn.utils.io import write_csv


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


@dataclass
class Table:
    """Rows of one target: ``columns`` in CSV order, ``md_columns`` those shown in markdown
    (default all), ``notes`` lines printed under the markdown table (data stand-ins, the
    paper's claims next to ours), ``incomplete`` the points without finished results,
    ``appendix`` more markdown after them."""

    target: str
    title: str
    columns: list[str]
    rows: list[dict[str, Any]]
    md_columns: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    appendix: str = ""  # more markdown after the notes (e.g. the paper's own table)

    def column(self, name: str, **where: Any) -> list[Any]:
        """The values of ``name`` in the rows matching every ``key=value`` of ``where``."""
        return [r.get(name) for r in self.rows if all(r.get(k) == v for k, v in where.items())]

    def write_csv(self, path: Path) -> None:
        """Every column of every row, atomically; numbers unrounded, missing values empty."""
        write_csv(path, self.rows, self.columns)

    def markdown(self) -> str:
        """The title, the table (``mean ± se``, paper's numbers beside ours) and the notes."""
        shown = [c for c in (self.md_columns or self.columns) if not c.endswith("_se")]
        lines = [f"# {self.target}: {self.title}", ""]
        lines.append("| " + " | ".join(shown) + " |")
        lines.append("|" + "---|" * len(shown))
        for row in self.rows:
            cells = [_md_cell(row.get(c), row.get(f"{c}_se")) for c in shown]
            lines.append("| " + " | ".join(cells) + " |")
        if self.notes:
            lines.append("")
            lines += [f"- {note}" for note in self.notes]
        if self.incomplete:
            lines += ["", "Points without finished results (not in the table): "]
            lines[-1] += ", ".join(self.incomplete)
        if self.appendix:
            lines += ["", self.appendix.rstrip("\n")]
        return "\n".join(lines) + "\n"


def _md_cell(value: Any, se: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}" + ("" if se is None else f" ± {se:.2f}")
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain markdown table (numbers with one decimal, as the paper prints them)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = ["–" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
