"""A target's result table: mean and standard error over seeds, as CSV and as markdown.

Columns ending in ``_se`` hold the standard error of the column before them; markdown shows
the pair as ``mean ± se``. Columns starting with ``paper`` hold the paper's reported numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from espn.utils.io import write_csv
from espn.utils.stats import markdown_lines, mean_se_cell

#: what every output of a target run below the paper's scale says first (markdown title and
#: first line, figure title, CSV ``scale`` column), so that no one mistakes it for a result
SCALE_BANNERS = {
    "smoke": "SMOKE SCALE — not a result",
    "cpu": "CPU SCALE — a reduced regime, not the paper's runs",
    "mixed": "MIXED SCALES — runs of different scales, not a result",
    "unknown": "SCALE UNKNOWN — the runs match no scale's points, not a result",
}
#: the line under the banner: what the scale means for the numbers
SCALE_NOTES = {
    "smoke": "a few dozen images and one epoch per phase: it checks that the target runs, "
    "its numbers mean nothing; use --scale cpu or paper for numbers",
    "cpu": "minutes on a CPU, Fashion-MNIST where the paper's data are absent and the "
    "recipe of docs/reproduce.md: compare with the paper in shape, not digit by digit",
    "mixed": "the directory holds runs made at different scales; rerun one scale into its "
    "own --out",
    "unknown": "rerun the target with --scale to know what the numbers are",
}


def scale_banner(scale: str | None) -> str:
    """The banner of a table or figure at ``scale`` ("" at the paper's scale or unset)."""
    return SCALE_BANNERS.get(scale or "paper", "")


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
    #: the scale of the runs (smoke, cpu, paper, mixed, unknown; None: not known to the table)
    scale: str | None = None
    #: the run directories (point names) the rows were built from
    points: list[str] = field(default_factory=list)

    def column(self, name: str, **where: Any) -> list[Any]:
        """The values of ``name`` in the rows matching every ``key=value`` of ``where``."""
        return [r.get(name) for r in self.rows if all(r.get(k) == v for k, v in where.items())]

    def write_csv(self, path: Path) -> None:
        """Every column of every row, atomically; numbers unrounded, missing values empty;
        the first column, ``scale``, says at which scale the runs were made."""
        scale = self.scale or "paper"
        write_csv(path, [{"scale": scale, **r} for r in self.rows], ["scale", *self.columns])

    def markdown(self) -> str:
        """The title (below the paper's scale: the scale first, and a line on what it means),
        the table (``mean ± se``, paper's numbers beside ours) and the notes."""
        shown = [c for c in (self.md_columns or self.columns) if not c.endswith("_se")]
        banner = scale_banner(self.scale)
        if banner:
            lines = [f"# {banner}: {self.target}: {self.title}", ""]
            lines += [f"> **{banner}**: {SCALE_NOTES[self.scale or 'paper']}.", ""]
        else:
            lines = [f"# {self.target}: {self.title}", ""]
        cells = [[mean_se_cell(r.get(c), r.get(f"{c}_se")) for c in shown] for r in self.rows]
        lines += markdown_lines(shown, cells)
        if self.notes:
            lines.append("")
            lines += [f"- {note}" for note in self.notes]
        if self.incomplete:
            lines += ["", "Points without finished results (not in the table): "]
            lines[-1] += ", ".join(self.incomplete)
        if self.appendix:
            lines += ["", self.appendix.rstrip("\n")]
        return "\n".join(lines) + "\n"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain markdown table (numbers with one decimal, as the paper prints them)."""
    cells = [
        ["–" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v) for v in r]
        for r in rows
    ]
    return "\n".join(markdown_lines(header, cells)) + "\n"
