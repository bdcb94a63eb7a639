"""Run a sweep's points: one after another in this process through :func:`run_point`, or on Ray
only when asked (``workers`` > 1, ``ray_address`` or ``RAY_ADDRESS``); see docs/sweeps.md."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from espn.settings.presets import FILE_SUFFIXES as PRESET_SUFFIXES
from espn.sweep.point import LOG_NAME, PointOutcome, changed_options, reused_outcome, run_point
from espn.sweep.spec import Point, SweepError, validate_points
from espn.utils.text import OutputConsole, printable

RAY_MISSING = (
    "running points on a Ray cluster needs Ray, which is not installed: pip install "
    "'espn[ray]' (or leave out --ray-address to run the points in this process)"
)
NO_RAY_NOTE = (
    "Ray is not installed: the {n} point(s) run one after another in this process "
    "(pip install 'espn[ray]' to run them in parallel)"
)
#: seconds to wait for a Ray cluster's address to answer before giving up
CONNECT_SECONDS = 5.0
#: object store of an embedded instance: points exchange only their results documents
LOCAL_OBJECT_STORE_BYTES = 128 * 2**20


class SweepOptions(TypedDict, total=False):
    """The keyword options of :func:`run_sweep` (passed on by :func:`espn.reproduce.run_target`)."""

    workers: int | None
    ray_address: str | None
    cpus_per_run: float
    gpus_per_run: float
    progress: bool
    overwrite: bool


def outcome_line(outcome: PointOutcome) -> str:
    """One line per finished point: status, name, accuracy, the run's recorded wall time and
    this attempt's seconds (none when reused), or the log when failed."""
    if outcome.status == "failed":
        return f"failed   {outcome.point.name}: {outcome.error} (log: {outcome.log})"
    doc = outcome.results or {}
    acc = doc.get("average_accuracy")
    acc_text = "-" if acc is None else f"{acc:.2f}%"
    wall = doc.get("wall_time_s")
    wall_text = "-" if not isinstance(wall, int | float) else f"{wall:.1f}s"
    attempt = "" if outcome.status == "reused" else f", this attempt {outcome.seconds:.1f}s"
    return (
        f"{outcome.status:<8} {outcome.point.name}: average accuracy {acc_text}  "
        f"run wall time {wall_text}{attempt}"
    )


def run_sweep(
    points: Sequence[Point],
    out: Path,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    cpus_per_run: float = 1.0,
    gpus_per_run: float = 0.0,
    progress: bool = True,
    overwrite: bool = False,
) -> list[PointOutcome]:
    """Run every point into ``out/<name>``, each validated before any runs; their outcomes in
    the points' order. Finished points are reused, killed ones resumed, a point holding a run
    of other options refused unless ``overwrite``; ``workers`` > 1 or ``ray_address`` (else
    ``RAY_ADDRESS``) runs them on Ray (docs/sweeps.md)."""
    out = Path(out).resolve()  # Ray workers need not share this process's directory
    check_resources(workers, cpus_per_run, gpus_per_run)
    validate_points(points, out)
    check_inside(points, out)
    # fixed: in-process points redirect sys.stdout to logs; text printed as written (no markup)
    console = OutputConsole(file=sys.stdout, markup=False)
    absolute = [anchored(p) for p in points]
    outcomes = {p.name: o for p in absolute if (o := reused_outcome(p, out)) is not None}
    todo = [p for p in absolute if p.name not in outcomes]
    if not overwrite:
        check_not_replacing(todo, out)
    ray_address = ray_address or os.environ.get("RAY_ADDRESS") or None
    in_process = _in_process(len(todo), workers, ray_address, gpus_per_run, console)
    with _reporter(len(points), console, progress) as report:
        for outcome in outcomes.values():
            report(outcome)
        ran = (
            (run_point(p, out) for p in todo)
            if in_process
            else _run_on_ray(todo, out, workers, ray_address, cpus_per_run, gpus_per_run)
        )
        for outcome in ran:
            outcomes[outcome.point.name] = outcome
            report(outcome)
    for p in points:  # the caller's points, as given
        outcomes[p.name].point = p
    return [outcomes[p.name] for p in points]


def _in_process(
    n_todo: int,
    workers: int | None,
    ray_address: str | None,
    gpus_per_run: float,
    console: OutputConsole,
) -> bool:
    """Whether the ``n_todo`` points left run in this process (Ray not asked for: one worker,
    no cluster; or missing without a cluster: said); otherwise the Ray target is checked."""
    if not n_todo or (ray_address is None and (workers or 1) <= 1):
        return True
    if not ray_available():
        if ray_address is not None:
            raise SweepError(RAY_MISSING)
        console.print(NO_RAY_NOTE.format(n=n_todo), highlight=False, markup=False)
        return True
    check_ray_target(ray_address, gpus_per_run)
    return False


def check_resources(workers: int | None, cpus_per_run: float, gpus_per_run: float) -> None:
    """Refuse worker counts and per-point resources no scheduler can honour."""
    if workers is not None and workers < 1:
        raise SweepError(f"workers must be >= 1, got {workers}")
    if not (math.isfinite(cpus_per_run) and 0 < cpus_per_run <= MAX_PER_RUN):
        raise SweepError(
            f"cpus_per_run must be a number in (0, {MAX_PER_RUN}], got {cpus_per_run:g}"
        )
    if not (math.isfinite(gpus_per_run) and 0 <= gpus_per_run <= MAX_PER_RUN):
        raise SweepError(
            f"gpus_per_run must be a number in [0, {MAX_PER_RUN}], got {gpus_per_run:g}"
        )


#: the most CPUs or GPUs one point may ask for
MAX_PER_RUN = 1024


def ray_available() -> bool:
    """Whether Ray can be imported here (without importing it)."""
    if "ray" in sys.modules:
        return sys.modules["ray"] is not None
    return importlib.util.find_spec("ray") is not None


def check_ray_target(address: str | None, gpus_per_run: float) -> None:
    """Refuse, before Ray starts, what Ray would wait on forever: GPUs this machine lacks, a
    cluster address that does not answer, ``ray://`` without the Ray client."""
    if address is None:
        have = torch.cuda.device_count()  # 0 without CUDA
        if gpus_per_run > have:
            raise SweepError(
                f"gpus_per_run {gpus_per_run:g} asks each point for more GPUs than this machine "
                f"has ({have}); use --gpus-per-run {min(have, 1) if have else 0} or "
                "--ray-address of a cluster with GPUs"
            )
        return
    if address == "auto":
        return
    target = address.removeprefix("ray://")
    if address.startswith("ray://") and importlib.util.find_spec("grpc") is None:
        raise SweepError(
            f"ray_address {address!r} needs the Ray client: pip install 'ray[client]' "
            "(or give the head's host:port, or auto)"
        )
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SweepError(
            f"ray_address {address!r} is not host:port (e.g. 10.0.0.5:6379), ray://host:port "
            "or auto"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_SECONDS).close()
    except OSError as exc:
        raise SweepError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with "
            "`ray start --head` there, or leave out --ray-address to run on this machine"
        ) from None


def check_inside(points: Sequence[Point], out: Path) -> None:
    """Refuse a point whose directory is a link out of ``out``."""
    for p in points:
        run_dir = out / p.name
        if run_dir.is_symlink() or (run_dir.exists() and run_dir.resolve().parent != out):
            raise SweepError(
                f"point {p.name}: {run_dir} is a link to {run_dir.resolve()}; a sweep reads and "
                f"writes only inside --out {out}: remove the link, or choose another --out"
            )


def check_not_replacing(points: Sequence[Point], out: Path) -> None:
    """Refuse points whose directory holds a run (finished or not) made with other options,
    naming each point and the options that differ; ``--overwrite`` replaces them."""
    changed = [f"{p.name} ({'; '.join(d)})" for p in points if (d := changed_options(p, out))]
    if changed:
        raise SweepError(
            f"{len(changed)} point(s) hold a run made with other options: "
            + ", ".join(changed)
            + "; pass --overwrite to replace them, or another --out"
        )


#: options naming files or directories, made absolute before a point runs anywhere
PATH_OPTIONS = ("data_dir", "init_weights", "from_run")


def anchored(point: Point) -> Point:
    """``point`` with its relative paths made absolute, to mean the same in a Ray worker."""
    options = dict(point.options)
    for key in PATH_OPTIONS:
        if options.get(key) is not None:
            options[key] = str(Path(options[key]).resolve())
    if options.get("folders"):
        options["folders"] = [str(Path(f).resolve()) for f in options["folders"]]
    preset = options.get("preset")
    if isinstance(preset, str) and preset.endswith(PRESET_SUFFIXES) and Path(preset).is_file():
        options["preset"] = str(Path(preset).resolve())
    return Point(point.name, options)


def _run_on_ray(
    points: list[Point],
    out: Path,
    workers: int | None,
    address: str | None,
    cpus: float,
    gpus: float,
) -> Iterator[PointOutcome]:
    """Yield each point's outcome as its Ray task finishes (Ray is there: see _in_process)."""
    import ray

    started = not ray.is_initialized()
    watchdog: subprocess.Popen[bytes] | None = None
    if started:
        common: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": logging.WARNING,
            "configure_logging": False,
        }
        if address is not None:
            ray.init(address=address, **common)
        else:
            n = workers or 1
            watchdog = _watch()  # before Ray starts: a kill at any time after is covered
            ray.init(
                num_cpus=max(1, math.ceil(n * cpus)),  # Ray wants whole CPUs (0.5 x 3 -> 2)
                num_gpus=torch.cuda.device_count(),
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                **common,
            )
    remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0)(run_point)
    pending = {remote.remote(p, out): p for p in points}
    try:
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            point = pending.pop(ref)
            try:
                outcome = ray.get(ref)
            except Exception as exc:  # the worker died (killed, out of memory): no outcome
                run_dir = out / point.name
                error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                outcome = PointOutcome(point, "failed", run_dir, None, error, run_dir / LOG_NAME)
            yield outcome
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
        if watchdog is not None:
            os.environ.pop(SWEEP_MARK, None)
            watchdog.communicate()  # EOF: it removes what the shutdown left, and ends


#: the environment variable that marks the processes of a sweep's local Ray instance (Ray
#: starts them from this process's environment, and its workers from theirs)
SWEEP_MARK = "ESPN_SWEEP_RAY"
#: a process that waits for the driver to end (its stdin closes, also when the driver is
#: killed with SIGKILL), then kills every process that carries the sweep's mark: Ray's
#: agents outlive a killed driver otherwise
WATCHDOG = """
import os, signal, sys
mark, driver = sys.argv[1].encode(), os.getppid()
sys.stdin.read()
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) in (os.getpid(), driver):
        continue
    try:
        with open(f"/proc/{entry}/environ", "rb") as fh:
            if mark in fh.read().split(b"\\0"):
                os.kill(int(entry), signal.SIGKILL)
    except OSError:  # the process ended since the listing
        continue
"""


def _watch() -> subprocess.Popen[bytes] | None:
    """Mark this process's environment for the local Ray it is about to start and start
    the watchdog that removes that Ray's processes once this process ends (Linux: /proc)."""
    if not Path("/proc/self/environ").exists():
        return None
    value = f"{os.getpid()}-{uuid.uuid4().hex}"
    os.environ[SWEEP_MARK] = value
    return subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, f"{SWEEP_MARK}={value}"], stdin=subprocess.PIPE
    )


@contextlib.contextmanager
def _reporter(total: int, console: Console, show: bool) -> Iterator[Callable[[PointOutcome], None]]:
    """A bar over points (rich) and one printed line per finished point."""
    bar = Progress(
        TextColumn("sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not show,
    )
    task = bar.add_task("points", total=total)

    def report(outcome: PointOutcome) -> None:
        bar.advance(task)
        if show:
            bar.console.print(printable(outcome_line(outcome)), highlight=False, soft_wrap=True)

    with bar:
        yield report
