"""A sweep's summary across seeds: one row per series (the points that differ only in their
``seed``) with the mean, standard error and count of each measure, written as
``OUT/summary.csv``, ``OUT/summary.md`` and ``OUT/summary.png``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from espn.sweep.point import PointOutcome
from espn.sweep.spec import value_text
from espn.utils.io import atomic_target, write_csv
from espn.utils.plotting import pyplot, write_figure
from espn.utils.stats import markdown_lines, mean_se, mean_se_cell

#: options that tell runs of one series apart (averaged over, not a series of their own)
REPEAT_KEYS = ("seed",)
#: the measures summarised: (column, what it is, how it is read from a run's results.json)
MEASURES: tuple[tuple[str, str, str], ...] = (
    ("average_accuracy", "average accuracy %", "final accuracy averaged over the tasks"),
    ("flops_ratio", "FLOPs ratio", "mean over the tasks of FLOPs / dense FLOPs"),
    ("max_forgetting", "max forgetting", "largest drop of a task's accuracy, in points"),
    ("wall_time_s", "wall time s", "seconds the run took"),
)


@dataclass
class Series:
    """The points of a sweep that differ only in :data:`REPEAT_KEYS`: their shared varying
    options (``values``), the finished runs' results and the number of failed points."""

    name: str
    values: dict[str, Any]
    results: list[dict[str, Any]]
    failed: int = 0


def group_series(outcomes: Sequence[PointOutcome]) -> tuple[list[str], list[Series]]:
    """The options that vary between series, and the series in the order of their first
    point. A sweep whose points differ only in their seed is one series, ``all``."""
    keys = list(dict.fromkeys(k for o in outcomes for k in o.point.options))
    varying = [
        k
        for k in keys
        if k not in REPEAT_KEYS and len({repr(o.point.options.get(k)) for o in outcomes}) > 1
    ]
    groups: dict[str, Series] = {}
    for o in outcomes:
        values = {k: o.point.options.get(k) for k in varying}
        name = " ".join(f"{k}={value_text(v)}" for k, v in values.items()) or "all"
        series = groups.setdefault(name, Series(name, values, []))
        if o.status == "failed" or o.results is None:
            series.failed += 1
        else:
            series.results.append(o.results)
    return varying, list(groups.values())


def _measure(doc: dict[str, Any], column: str) -> float | None:
    """One finite measure of a finished run, else None (never a NaN)."""
    value: float | None = None
    if column == "flops_ratio":
        ratios = doc.get("flops_ratio") or []
        value = sum(ratios) / len(ratios) if ratios else None
    elif column == "max_forgetting":
        forgetting = doc.get("forgetting") or []
        value = float(max(forgetting)) if forgetting else None
    elif doc.get(column) is not None:
        value = float(doc[column])
    return value if value is not None and math.isfinite(value) else None


def summary_rows(outcomes: Sequence[PointOutcome]) -> tuple[list[str], list[dict[str, Any]]]:
    """The CSV's columns and rows: per series its varying options, ``runs`` (finished),
    ``failed``, and per measure its mean, ``_se`` (standard error) and ``_n`` (count)."""
    varying, series = group_series(outcomes)
    columns = ["series", *varying, "runs", "failed"]
    for column, _, _ in MEASURES:
        columns += [column, f"{column}_se", f"{column}_n"]
    rows = []
    for s in series:
        row: dict[str, Any] = {"series": s.name, **s.values}
        row.update({k: value_text(v) for k, v in s.values.items() if isinstance(v, list | tuple)})
        row["runs"], row["failed"] = len(s.results), s.failed
        for column, _, _ in MEASURES:
            found = [v for v in (_measure(d, column) for d in s.results) if v is not None]
            row[column], row[f"{column}_se"] = mean_se(found)
            row[f"{column}_n"] = len(found)
        rows.append(row)
    return columns, rows


def summary_markdown(rows: list[dict[str, Any]], out: Path) -> str:
    """The summary as a markdown table (``mean ± se``, n), with what each column means."""
    header = ["series", "runs", "failed", *(title for _, title, _ in MEASURES)]
    lines = [
        f"# Sweep summary: {out}",
        "",
        "Per series (the points that differ only in their seed): mean ± standard error over "
        "its finished runs (n = runs; no ± with one run).",
        "",
    ]
    cells = [
        [r["series"], str(r["runs"]), str(r["failed"])]
        + [mean_se_cell(r[c], r[f"{c}_se"]) for c, _, _ in MEASURES]
        for r in rows
    ]
    lines += [*markdown_lines(header, cells), ""]
    lines += [f"- {title}: {meaning}" for _, title, meaning in MEASURES]
    return "\n".join(lines) + "\n"


def summary_plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Bars: each series' mean accuracy and standard error, its run count above."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(rows) + 2), 4))
    xs = list(range(len(rows)))
    means = [r["average_accuracy"] if r["average_accuracy"] is not None else 0.0 for r in rows]
    errs = [r["average_accuracy_se"] or 0.0 for r in rows]
    ax.bar(xs, means, yerr=errs, capsize=4, color="tab:blue", alpha=0.85)
    for x, r, m in zip(xs, rows, means, strict=True):
        ax.annotate(f"n={r['average_accuracy_n']}", (x, m), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs, [r["series"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_ylabel("average accuracy % (mean ± se over seeds)")
    ax.set_title("sweep summary per series")
    ax.grid(True, axis="y", alpha=0.3)
    write_figure(fig, path)


def write_summary(outcomes: Sequence[PointOutcome], out: Path) -> list[Path]:
    """Write ``OUT/summary.csv``, ``.md`` and ``.png`` atomically; their paths."""
    out = Path(out)
    paths = [out / f"summary.{kind}" for kind in ("csv", "md", "png")]
    columns, rows = summary_rows(outcomes)
    write_csv(paths[0], rows, columns)
    with atomic_target(paths[1]) as tmp:
        tmp.write_text(summary_markdown(rows, out))
    summary_plot(rows, paths[2])
    return paths
