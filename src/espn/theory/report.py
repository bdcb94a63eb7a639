"""Reading a theory-lab CSV back, and the plain-text summaries of the experiments (what the
CLI prints)."""

from __future__ import annotations

import contextlib
import csv
from pathlib import Path
from typing import Any

from espn.theory.config import COLUMNS, TheoryConfigError
from espn.utils.io import read_csv

#: the CSV columns that hold text; every other cell is a number
TEXT_COLUMNS = ("setting", "order")


def read_rows(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """The experiment of a theory CSV (told by its columns) and its rows, numbers parsed back
    to int/float; refused, naming the file, when it is not one."""
    try:
        rows = [{k: _parse(v) for k, v in row.items()} for row in read_csv(path)]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TheoryConfigError(f"CSV: {path} is not a CSV file ({exc})") from None
    keys = set(rows[0]) if rows else set()
    kind = next((k for k, columns in COLUMNS.items() if keys == set(columns)), None)
    if kind is None:
        raise TheoryConfigError(
            f"CSV: columns match none of the theory experiments ({', '.join(COLUMNS)})"
        )
    for line, row in enumerate(rows, start=2):
        for column, value in row.items():
            if column not in TEXT_COLUMNS and isinstance(value, str) and value != "":
                raise TheoryConfigError(
                    f"CSV: {path} line {line}, column {column}: {value!r} is not a number"
                )
    return kind, rows


def _parse(text: str) -> Any:
    """A CSV cell as int, else float, else the text itself."""
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def _num(value: float | None, fmt: str = ".0f") -> str:
    return "-" if value is None else format(value, fmt)


def format_sample_complexity(summary: dict[str, Any]) -> str:
    """Table: N*T needed to reach the target per setting, measured vs predicted."""
    target = summary["target"]
    lines = [
        f"N*T needed to reach excess risk {target:g} (measured: log-log interpolation of the "
        f"mean curve; predicted: c*dof/{target:g} with one fitted c = {summary['rate_constant']:.3g})",
        f"{'setting':<22}{'r_new':>6}{'dof':>7}{'measured':>11}{'predicted':>11}"
        f"{'scratch/this measured':>23}{'dof ratio (bound)':>19}",
    ]
    for s in summary["settings"]:
        measured = _num(s["nt_needed"]) if s["nt_needed"] is not None else f">{s['max_nt']:.0f}"
        lines.append(
            f"{s['setting']:<22}{s['r_new']:>6}{s['dof']:>7.0f}{measured:>11}"
            f"{s['nt_predicted']:>11.0f}{_num(s['ratio_measured'], '.2f'):>23}"
            f"{_num(s['ratio_predicted'], '.2f'):>19}"
        )
    frozen = [s for s in summary["settings"] if s["excess_ratio_at_max_nt"] is not None]
    for s in frozen:
        if s["r_frz"] == 0:
            continue
        lines.append(
            f"at N*T = {s['max_nt']:.0f}: excess scratch / {s['setting']} = "
            f"{s['excess_ratio_at_max_nt']:.2f} (dof ratio {s['ratio_predicted']:.2f})"
        )
    return "\n".join(lines)


def format_mismatch(summary: dict[str, Any]) -> str:
    """Table: measured MM per perturbation next to the frozen-feature risk floor."""
    lines = [
        f"noise floor E[Z^2] = {summary['noise_floor']:.4f}; MM from a large noise-free solve "
        "(in-sample / on the test set); floor = frozen excess risk at the largest N*T",
        f"{'perturbation':>12}{'MM (train)':>12}{'MM (test)':>12}{'floor':>10}"
        f"{'floor/MM':>10}{'min excess':>12}",
    ]
    for p in summary["perturbations"]:
        lines.append(
            f"{p['perturbation']:>12g}{p['mm_train']:>12.4g}{p['mm_test']:>12.4g}"
            f"{p['floor']:>10.4g}{_num(p['floor_over_mm'], '.2f'):>10}{p['min_excess']:>12.4g}"
        )
    if summary["scratch_at_max_nt"] is not None:
        lines.append(
            f"from scratch at the largest N*T: excess {summary['scratch_at_max_nt']:.4g} "
            "(keeps falling towards 0)"
        )
    return "\n".join(lines)


def format_task_order(summary: dict[str, Any]) -> str:
    """Table: average excess and test risk per order, overall and per half."""
    ids = summary["task_ids"]
    half = max(len(ids) // 2, 1)
    lines = [
        f"per-head sample sizes by task ID: {summary['sizes']}",
        f"{'order':<12}{'avg excess':>12}{'avg test risk':>15}"
        f"{f'excess IDs 1-{half}':>16}{f'excess IDs {half + 1}-{len(ids)}':>18}",
    ]
    for o in summary["orders"]:
        lines.append(
            f"{o['order']:<12}{o['average_excess']:>12.4g}{o['average_test_risk']:>15.4g}"
            f"{_num(o['large_tasks_excess'], '.4g'):>16}{_num(o['small_tasks_excess'], '.4g'):>18}"
        )
    return "\n".join(lines)
