"""One point of a sweep, an ``espn run`` directory ``OUT/<name>`` (its output in ``log.txt``),
run to the end in whatever process Ray (or the caller) gives it: reused when finished with the
same options, resumed from a checkpoint of them, else started over (see docs/sweeps.md)."""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from espn.runs.checks import option_differences, saved_config
from espn.runs.config import make_config
from espn.sweep.spec import Point
from espn.utils.io import read_json, write_json_atomic

LOG_NAME = "log.txt"


@dataclass
class PointOutcome:
    """How one point ended: ``status`` is ``done``, ``reused``, ``resumed`` or ``failed``."""

    point: Point
    status: str
    run_dir: Path
    results: dict[str, Any] | None  # parsed results.json when finished
    error: str | None
    log: Path  # the point's log file
    seconds: float = 0.0  # wall time of this attempt (0 when reused)


def non_finite(doc: Any) -> str | None:
    """Where a parsed JSON ``doc`` holds NaN or an infinity (``accuracy_matrix[1][0] = nan``:
    espn never writes one, so it was changed or damaged); None when every number is finite."""
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{path or 'document'} = {item}"
        if isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(item))
    return None


def _results(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/results.json`` if it is a readable JSON object."""
    try:
        doc = read_json(run_dir / "results.json")
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def changed_options(point: Point, out: Path) -> list[str]:
    """How the run in ``out/<point.name>`` (results.json, else checkpoint) differs from ``point``'s
    options; empty when it holds none or one of the same options."""
    run_dir = Path(out) / point.name
    cfg = make_config(**point.options, out=run_dir)
    recorded = (_results(run_dir) or {}).get("config")
    for saved in (recorded if isinstance(recorded, dict) else None, saved_config(run_dir)):
        if saved is not None and (diffs := option_differences(saved, cfg)):
            return diffs
    return []


def set_aside_corrupt_results(run_dir: Path) -> tuple[Path, str] | None:
    """Move an unreadable ``results.json``, or one holding NaN or an infinity, aside (to
    ``results.json.corrupt``: resuming rewrites it); where it went and why."""
    from espn.evaluation.results import ResultsError, read_results

    try:
        doc = read_results(run_dir)
        bad = non_finite(doc)
        reason = None if bad is None else f"it holds {bad}"
    except ResultsError as exc:
        reason = str(exc)
    if reason is None:
        return None
    kept = run_dir / "results.json.corrupt"
    os.replace(run_dir / "results.json", kept)
    return kept, reason


def reused_outcome(point: Point, out: Path) -> PointOutcome | None:
    """The outcome of a point whose run in ``out`` is finished, finite and made with exactly
    its options, else None."""
    run_dir = Path(out) / point.name
    doc = _results(run_dir)
    if doc is None or not doc.get("complete") or non_finite(doc):
        return None
    if option_differences(doc.get("config", {}), make_config(**point.options, out=run_dir)):
        return None
    return PointOutcome(point, "reused", run_dir, doc, None, run_dir / LOG_NAME)


def run_point(point: Point, out: Path) -> PointOutcome:
    """Run (reuse, resume) ``point`` into ``out/<point.name>``; its own failure is returned as
    status ``failed`` with a one-line error (the traceback in the log), never raised."""
    from espn.api import experiment  # looked up at call time: tests may patch run_experiment

    run_dir = Path(out) / point.name
    log = run_dir / LOG_NAME
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("a", buffering=1) as fh:

        def say(line: str) -> None:
            fh.write(line.rstrip("\n") + "\n")

        say(f"== espn sweep point {point.name} {time.strftime('%Y-%m-%d %H:%M:%S')}")
        try:
            reused = reused_outcome(point, out)
            if reused is not None:
                say("reused: results.json is complete and made with the same options")
                return reused
            cfg = make_config(**point.options, out=run_dir)
            saved = saved_config(run_dir)  # a checkpoint of the same options: a killed point
            resume = saved is not None and not option_differences(saved, cfg)
            if resume and (kept := set_aside_corrupt_results(run_dir)) is not None:
                say(f"results.json was not used ({kept[1]}); kept as {kept[0].name}")
            say(f"resumed from {run_dir / 'checkpoint'}" if resume else "started")
            with contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
                doc = experiment.run_experiment(
                    cfg,
                    progress=False,
                    on_task_end=say,
                    resume=resume,
                    overwrite=not resume,
                    on_warning=lambda line: say(f"warning: {line}"),
                )
            if not (run_dir / "results.json").exists():  # every task was in the checkpoint
                write_json_atomic(run_dir / "results.json", doc)
        except Exception as exc:
            fh.write(traceback.format_exc())
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            say(f"failed: {error}")
            return PointOutcome(
                point, "failed", run_dir, None, error, log, time.perf_counter() - start
            )
        seconds = time.perf_counter() - start
        say(f"finished in {seconds:.1f}s: average accuracy {doc['average_accuracy']:.2f}%")
        status = "resumed" if resume else "done"
        return PointOutcome(point, status, run_dir, doc, None, log, seconds)
