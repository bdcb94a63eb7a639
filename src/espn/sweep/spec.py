"""Sweep specifications (see docs/sweeps.md): ``base`` options shared by every point, a
``grid`` of lists whose cartesian product gives the points (the last key varying fastest), and
an optional ``name`` template over the grid's keys, expanded into named points."""

from __future__ import annotations

import itertools
import math
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from espn.runs.config import ConfigError, make_config, run_option_names
from espn.utils.documents import check_size, load_document
from espn.utils.limits import MAX_FORMAT_WIDTH

SPEC_KEYS = ("base", "grid", "name")
#: the most points a sweep may have: a grid beyond it is refused before it is expanded
MAX_POINTS = 10_000
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


class SweepError(ConfigError):
    """A sweep spec or point list is not accepted; the message says what and why."""


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its run directory is ``OUT/<name>``."""

    name: str  # unique, filesystem-safe
    options: dict[str, Any]  # make_config(**options) keyword arguments (no "out")


def load_spec(path: Path) -> dict[str, Any]:
    """Read a ``.json``, ``.yaml`` or ``.yml`` sweep spec file."""
    spec: dict[str, Any] = load_document(path, "sweep spec", SweepError)
    return spec


def value_text(value: Any) -> str:
    """A swept value as point names and summaries write it (``0.1``, ``1,2,3``)."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ",".join(value_text(v) for v in value)
    return str(value)


def safe_name(text: str) -> str:
    """``text`` with every run of characters unsafe in a file name replaced by ``-``."""
    return _UNSAFE.sub("-", text).strip("-.") or "point"


def default_name(values: dict[str, Any]) -> str:
    """A name from grid values, e.g. ``espn_gamma0.2_seed0``."""
    parts = [
        value_text(v) if key == "method" else f"{key}{value_text(v)}" for key, v in values.items()
    ]
    return safe_name("_".join(parts) or "base")


def check_template(template: Any) -> None:
    """Refuse a point-name template that is not a format string, or has a width or precision
    beyond :data:`~espn.utils.limits.MAX_FORMAT_WIDTH` (``{seed:>999999999}``) or nested fields."""
    if not isinstance(template, str):
        raise SweepError(f"sweep spec: 'name' must be a format string, got {template!r}")
    try:
        fields = [
            (f, s or "") for _, f, s, _ in string.Formatter().parse(template) if f is not None
        ]
    except ValueError as exc:
        raise SweepError(f"sweep spec: name template {template!r} is not valid ({exc})") from None
    for field, format_spec in fields:
        sizes = [int(n) for n in re.findall(r"\d+", format_spec)]
        if "{" in format_spec or any(n > MAX_FORMAT_WIDTH for n in sizes):
            raise SweepError(
                f"sweep spec: name template {template!r} formats {field!r} with "
                f"{format_spec!r}; widths and precisions up to {MAX_FORMAT_WIDTH} are accepted"
            )


def expand_spec(spec: Any) -> list[Point]:
    """The points of a sweep spec (see the module docstring), every one validated."""
    if not isinstance(spec, dict):
        raise SweepError(f"a sweep spec must be a mapping with keys {', '.join(SPEC_KEYS)}")
    check_size(spec, "sweep spec", SweepError)
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise SweepError(
            f"unknown sweep spec key(s) {', '.join(unknown)}; accepted: {', '.join(SPEC_KEYS)}"
        )
    base = spec.get("base") or {}
    grid = spec.get("grid") or {}
    if not isinstance(base, dict) or not isinstance(grid, dict):
        raise SweepError("sweep spec: 'base' and 'grid' must be mappings of option -> value(s)")
    accepted = run_option_names()
    for key in [*base, *grid]:
        if key not in accepted:
            raise SweepError(f"sweep spec: unknown option {key!r}; accepted: {', '.join(accepted)}")
    both = sorted(set(base) & set(grid))
    if both:
        raise SweepError(f"sweep spec: {', '.join(both)} in both 'base' and 'grid'; give it once")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(
                f"sweep spec: grid {key!r} must be a non-empty list of values, got {values!r}"
            )
    size = math.prod(len(v) for v in grid.values())
    if size > MAX_POINTS:
        raise SweepError(
            f"sweep spec: the grid has {size} points ("
            + " x ".join(f"{len(v)} {k}" for k, v in grid.items())
            + f"), more than the {MAX_POINTS} a sweep may have; split it into smaller sweeps"
        )
    template = spec.get("name")
    if template is not None:
        check_template(template)
    points = []
    for combo in itertools.product(*grid.values()):
        values = dict(zip(grid, combo, strict=True))
        if template is None:
            name = default_name(values)
        else:
            try:
                name = safe_name(template.format(**{k: value_text(v) for k, v in values.items()}))
            except (KeyError, IndexError, ValueError) as exc:
                raise SweepError(
                    f"sweep spec: name template {template!r} uses {exc}, which is not a grid "
                    f"key; grid keys: {', '.join(grid) or '(none)'}"
                ) from None
        points.append(Point(name, {**base, **values}))
    validate_points(points)
    return points


def validate_points(points: Sequence[Point], out: Path | None = None) -> None:
    """Check names (unique, filesystem-safe) and build every point's configuration, so that
    a bad point is refused before any point runs."""
    if not points:
        raise SweepError("the sweep has no points")
    if len(points) > MAX_POINTS:
        raise SweepError(
            f"the sweep has {len(points)} points, more than the {MAX_POINTS} a sweep may have; "
            "split it into smaller sweeps"
        )
    counts = Counter(p.name for p in points)
    repeated = sorted(n for n, c in counts.items() if c > 1)
    if repeated:
        raise SweepError(
            f"point name(s) {', '.join(repeated)} given more than once; every point needs its "
            "own name (add the varying option to the name template)"
        )
    for p in points:
        if not p.name or safe_name(p.name) != p.name:
            raise SweepError(
                f"point name {p.name!r} is not a safe directory name; use letters, digits "
                "and . _ = + -"
            )
        if "out" in p.options:
            raise SweepError(f"point {p.name}: 'out' is set by the sweep (OUT/{p.name}); drop it")
        try:
            make_config(**p.options, out=Path(out or ".") / p.name)
        except ConfigError as exc:
            raise SweepError(f"point {p.name}: {exc}") from None
