"""Run a target's points on the sweep engine and write ``OUT/TARGET.csv/.md/.png``; rebuild
those files from the run directories alone (``espn reproduce report``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from espn.errors import EspnError
from espn.reproduce.table import Table
from espn.reproduce.target import (
    SCALES,
    TARGETS,
    Options,
    ReproduceError,
    Run,
    Target,
    parse_name,
)
from espn.utils.io import atomic_target, read_json, write_json_atomic

if TYPE_CHECKING:
    from espn.sweep import Point, PointOutcome, SweepOptions


@dataclass
class TargetResult:
    """What ``run_target`` did: the table, the files written, every point's outcome and the
    points not run because the run they start from failed."""

    target: str
    table: Table
    files: list[Path]
    outcomes: list[PointOutcome] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def run_target(
    name: str,
    options: Options,
    out: Path,
    **sweep: Unpack[SweepOptions],
) -> TargetResult:
    """Run (reuse, resume) every point of target ``name`` at ``options`` into ``out``, stage
    by stage through :func:`espn.sweep.run_sweep`, then write its table and figure."""
    target = TARGETS.get(name)
    out = Path(out)
    stages = target.stages(options, out)  # validates data locations before anything runs
    from espn.sweep import run_sweep

    outcomes: list[PointOutcome] = []
    skipped: list[str] = []
    failed: set[Path] = set()
    for stage in stages:
        ready = [p for p in stage if _source(p) not in failed]
        skipped += [p.name for p in stage if _source(p) in failed]
        if ready:
            outcomes += run_sweep(ready, out, **sweep)
        failed |= {o.run_dir.resolve() for o in outcomes if not _complete(o.results)}
    runs, missing = [], list(skipped)
    for o in outcomes:
        doc = o.results if _complete(o.results) else _read(o.run_dir)  # a partial run's tasks
        if doc is None:
            missing.append(o.point.name)
        else:
            runs.append(_run(o.point.name, doc))
    table = _build(target, runs, missing, options.scale)
    return TargetResult(name, table, write_outputs(target, table, out), outcomes, skipped)


def _source(point: Point) -> Path | None:
    """The run directory a point starts from (``from_run``), if any."""
    source = point.options.get("from_run")
    return None if source is None else Path(source).resolve()


def _complete(doc: dict[str, Any] | None) -> bool:
    return isinstance(doc, dict) and bool(doc.get("complete"))


def _read(run_dir: Path) -> dict[str, Any] | None:
    """A run directory's results with at least one finished task, else None."""
    from espn.evaluation.results import ResultsError, read_results

    try:
        doc = read_results(run_dir)
    except ResultsError:
        return None
    return doc if doc and doc.get("final_accuracy") else None


def _run(name: str, doc: dict[str, Any]) -> Run:
    parsed = parse_name(name)
    assert parsed is not None, name
    return Run(name, parsed[1], parsed[2], doc, _complete(doc))


def _build(target: Target, runs: list[Run], missing: list[str], scale: str | None) -> Table:
    """The target's table from its runs, made at ``scale``; runs that stopped early enter
    only ``partial`` targets, the others are listed as incomplete with the points that left
    no results."""
    used = sorted((r for r in runs if r.complete or target.partial), key=lambda r: r.name)
    table = target.table(used)
    table.incomplete = sorted([*missing, *(r.name for r in runs if r not in used)])
    table.scale = scale
    table.points = [r.name for r in used]
    return table


def points_file(out: Path, target: str) -> Path:
    """``OUT/TARGET.points.json``: the run directories the target's table was built from."""
    return Path(out) / f"{target}.points.json"


def write_outputs(target: Target, table: Table, out: Path) -> list[Path]:
    """``OUT/TARGET.csv``, ``.md`` and ``.png``, each written atomically, and the names of the
    run directories they were built from (:func:`points_file`), written last."""
    paths = [out / f"{target.name}.{ext}" for ext in ("csv", "md", "png")]
    table.write_csv(paths[0])
    with atomic_target(paths[1]) as tmp:
        tmp.write_text(table.markdown())
    target.plot(table, paths[2])
    write_json_atomic(points_file(out, target.name), {"points": table.points})
    return paths


def lost_points(out: Path, table: Table) -> list[str]:
    """The run directories that ``table``'s earlier version (as :func:`points_file` records
    it) was built from and that ``table`` lacks: deleted, moved, or no longer finished."""
    path = points_file(out, table.target)
    try:
        doc = read_json(path)
    except FileNotFoundError:
        return []  # no earlier table, or one written before the points were recorded
    except (OSError, ValueError) as exc:
        raise ReproduceError(
            f"report: {path} is unreadable ({exc}), so it cannot be told whether {table.target}'s "
            "table would lose rows; no table was rewritten: delete it to build the table anew"
        ) from None
    earlier = doc.get("points") if isinstance(doc, dict) else None
    if not isinstance(earlier, list):
        earlier = []
    return sorted(set(map(str, earlier)) - set(table.points))


def collect(
    out: Path,
) -> tuple[dict[str, tuple[list[Run], list[str]]], list[tuple[str, str]], dict[str, set[str]]]:
    """The run directories of every target in ``out``: per target its runs with results
    (finished or stopped early) and the names of its directories with no finished task; the
    directories left out as (target, why): a corrupt results.json, or a run of another
    benchmark or method than its name says; per target the scales its runs were made at
    (``unknown`` for a run that matches no scale's points)."""
    from espn.evaluation.results import ResultsError, read_results

    found: dict[str, tuple[list[Run], list[str]]] = {}
    problems: list[tuple[str, str]] = []
    scales: dict[str, set[str]] = {}
    expected: dict[tuple[str, int], Points | None] = {}
    for directory in sorted(Path(out).iterdir()):
        parsed = parse_name(directory.name)
        if parsed is None or not directory.is_dir() or parsed[0] not in TARGETS:
            continue
        runs, missing = found.setdefault(parsed[0], ([], []))
        try:
            doc = read_results(directory)
        except ResultsError as exc:
            problems.append((parsed[0], f"{directory.name}: {exc}"))
            continue
        if not doc or not doc.get("final_accuracy"):
            missing.append(directory.name)
            continue
        key = (parsed[0], parsed[2])
        if key not in expected:
            expected[key] = _points(TARGETS.get(parsed[0]), parsed[2], Path(out), doc)
        why = _foreign(directory.name, doc, expected[key])
        if why is not None:
            problems.append((parsed[0], f"{directory.name}: {why}"))
            continue
        runs.append(_run(directory.name, doc))
        scales.setdefault(parsed[0], set()).add(_scale_of(directory.name, doc, expected[key]))
    return found, problems, scales


#: options whose value tells which run a point is
IDENTITY = ("benchmark", "method", "preset")
#: options whose values tell at which scale a point was made
SCALE_KEYS = (
    "preset",
    "benchmark",
    "tasks",
    "train_per_task",
    "test_per_task",
    "epochs",
    "batch_size",
    "step_floor",
)


#: per point name, its (scale, options) at every scale whose points can be built
Points = dict[str, list[tuple[str, dict[str, Any]]]]


def _points(target: Target, seed: int, out: Path, doc: dict[str, Any]) -> Points | None:
    """The points of ``target`` up to ``seed`` at every scale whose points can be built here,
    with the data locations the run ``doc`` used (None if none can: then a run cannot be
    checked)."""
    config = doc.get("config") or {}
    folders = config.get("folders") or []
    where: dict[str, Any] = {
        "data_dir": config.get("data_dir"),
        "data_root": Path(folders[-1]).parent if folders else None,
        "init_weights": config.get("init_weights"),
    }
    points: Points = {}
    built = False
    for scale in SCALES:
        try:
            stages = target.stages(Options(scale=scale, seeds=seed + 1, **where), out)
        except EspnError:
            continue
        built = True
        for stage in stages:
            for p in stage:
                points.setdefault(p.name, []).append((scale, p.options))
    return points if built else None


def _same(a: Any, b: Any) -> bool:
    """Option values equal as JSON keeps them (a tuple and a list of the same items alike)."""
    return bool(json.loads(json.dumps(a)) == json.loads(json.dumps(b)))


def _scale_of(name: str, doc: dict[str, Any], points: Points | None) -> str:
    """The first scale (smallest first) whose point ``name`` sets :data:`SCALE_KEYS` as the
    run was made with, or ``unknown``."""
    config = doc.get("config") or {}
    for scale, options in (points or {}).get(name, []):
        if all(_same(options[k], config.get(k)) for k in SCALE_KEYS if options.get(k) is not None):
            return scale
    return "unknown"


def _foreign(name: str, doc: dict[str, Any], points: Points | None) -> str | None:
    """Why the run ``doc`` in directory ``name`` is not that point of its target, or None."""
    if points is None:
        return None
    if name not in points:
        return "its name is not a point of the target at any scale"
    config = doc.get("config") or {}
    for _, options in points[name]:
        if all(
            options.get(k) is None or config.get(k) is None or options[k] == config[k]
            for k in IDENTITY
        ):
            return None
    ours = ", ".join(f"{k} {config.get(k)!r}" for k in IDENTITY if config.get(k) is not None)
    return f"it holds a run of {ours}, not of this point"


def report(out: Path, targets: list[str] | None = None) -> list[TargetResult]:
    """Rebuild the table and figure of every target (or of ``targets``) whose run
    directories are in ``out``, from those directories alone."""
    out = Path(out)
    if not out.is_dir():
        raise ReproduceError(f"report: {out} is not a directory (give the --out of espn reproduce)")
    for name in targets or []:
        TARGETS.get(name)
    found, problems, scales = collect(out)
    wanted = targets or list(found)
    missing = [t for t in wanted if t not in found]
    if not found or missing:
        raise ReproduceError(
            f"report: no run directories of {', '.join(missing) or 'any target'} in {out} "
            "(they are named TARGET__SERIES__seedK by espn reproduce)"
        )
    unusable = [why for target, why in problems if target in wanted]
    if unusable:
        raise ReproduceError(
            f"report: {len(unusable)} run director(ies) cannot be used, so no table was "
            "rewritten: " + "; ".join(unusable) + "; rerun those points (espn reproduce ... "
            "--overwrite) or move them out of the directory"
        )
    tables = {}
    for name in wanted:
        seen = scales.get(name, set())
        scale = next(iter(seen)) if len(seen) == 1 else "mixed" if seen else None
        tables[name] = _build(TARGETS.get(name), *found[name], scale)
    lost = {name: names for name, table in tables.items() if (names := lost_points(out, table))}
    if lost:
        raise ReproduceError(
            "report: "
            + "; ".join(
                f"{name}'s table was built from {len(names)} run director(ies) that are now "
                f"missing or unfinished ({', '.join(names)})"
                for name, names in lost.items()
            )
            + ", so no table was rewritten (a complete table is never replaced by a partial "
            "one): restore them, or rerun those points (espn reproduce TARGET ... with the same "
            "--out); to build the tables from what is left, delete "
            + ", ".join(points_file(out, name).name for name in lost)
        )
    return [
        TargetResult(name, table, write_outputs(TARGETS.get(name), table, out))
        for name, table in tables.items()
    ]
