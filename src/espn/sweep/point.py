"""One point of a sweep, run to the end in whatever process Ray (or the caller) gives it.

The point is an ordinary ``espn run`` directory ``OUT/<name>``; what the run prints goes to
``OUT/<name>/log.txt``. A point whose complete ``results.json`` was made with the same
options is reused, one whose checkpoint holds the same options is resumed from it, and any
other content of the directory is replaced.
"""

from __future__ import annotations

import contextlib
import json
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from espn.checkpoint.run import option_differences, saved_config
from espn.config import RunConfig, make_config
from espn.sweep.spec import Point

LOG_NAME = "log.txt"
STATUSES = ("done", "reused", "resumed", "failed")


@dataclass
class PointOutcome:
    """How one point ended: ``status`` is one of :data:`STATUSES`."""

    point: Point
    status: str
    run_dir: Path
    results: dict[str, Any] | None  # parsed results.json when finished
    error: str | None
    log: Path  # the point's log file
    seconds: float = 0.0  # wall time of this attempt (0 when reused)


def finished_results(cfg: RunConfig) -> dict[str, Any] | None:
    """The results of an earlier complete run of exactly ``cfg`` (output path aside)."""
    try:
        doc = json.loads((Path(cfg.out) / "results.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not doc.get("complete"):
        return None
    return None if option_differences(doc.get("config", {}), cfg) else doc


def resumable(cfg: RunConfig) -> bool:
    """Whether ``cfg.out`` holds a checkpoint of the same options (a killed point)."""
    saved = saved_config(cfg.out)
    return saved is not None and not option_differences(saved, cfg)


def reused_outcome(point: Point, out: Path) -> PointOutcome | None:
    """The outcome of a point that is already finished in ``out``, else None."""
    run_dir = Path(out) / point.name
    doc = finished_results(make_config(**point.options, out=run_dir))
    if doc is None:
        return None
    return PointOutcome(point, "reused", run_dir, doc, None, run_dir / LOG_NAME)


def run_point(point: Point, out: Path) -> PointOutcome:
    """Run (reuse, resume) ``point`` into ``out/<point.name>``; never raises for the point's
    own failure, which is returned as status ``failed`` with its one-line error (the
    traceback is in the log)."""
    from espn import experiment  # looked up at call time: tests may patch run_experiment

    run_dir = Path(out) / point.name
    log = run_dir / LOG_NAME
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("a", buffering=1) as fh:

        def say(line: str) -> None:
            fh.write(line.rstrip("\n") + "\n")

        say(f"== espn sweep point {point.name} {time.strftime('%Y-%m-%d %H:%M:%S')}")
        try:
            cfg = make_config(**point.options, out=run_dir)
            done = finished_results(cfg)
            if done is not None:
                say("reused: results.json is complete and made with the same options")
                return PointOutcome(point, "reused", run_dir, done, None, log)
            resume = resumable(cfg)
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
