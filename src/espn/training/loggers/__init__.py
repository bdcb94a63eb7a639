"""Experiment loggers: CSV, TensorBoard and W&B, each a callback of the learner writing into
``RUN/logs/`` (``espn run --log tensorboard,csv``, ``ContinualLearner(..., loggers=[...])``;
what each records: docs/logging.md). TensorBoard and W&B are optional extras; asking for one
that is not installed is an error naming the extra, raised before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from espn.registry import Registry
from espn.settings.training import DEFAULT_LOG_EVERY
from espn.training.callbacks import Callback
from espn.training.loggers.base import LoggerError, LoggerUnavailable, MetricLogger, check_log_every
from espn.training.loggers.csv_logger import CSVLogger
from espn.training.loggers.tensorboard_logger import TensorBoardLogger
from espn.training.loggers.wandb_logger import WandbLogger

#: the loggers ``--log`` accepts, by name
LOGGERS: Registry[type[MetricLogger]] = Registry("logger")
for _cls in (CSVLogger, TensorBoardLogger, WandbLogger):
    LOGGERS.register(_cls.name)(_cls)

__all__ = [
    "LOGGERS",
    "CSVLogger",
    "LoggerError",
    "LoggerUnavailable",
    "MetricLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "logger_names",
    "logging_options",
    "make_loggers",
]


def logger_names(names: str | Sequence[str | Callback]) -> list[str | Callback]:
    """The logger names in ``names`` (``"tensorboard,csv"`` or a list of names and Callbacks),
    checked: each known, none twice, its optional extra installed; the Callbacks kept in
    place, blank names dropped."""
    items = names.split(",") if isinstance(names, str) else list(names)
    chosen: list[str | Callback] = []
    for item in items:
        if isinstance(item, Callback):
            chosen.append(item)
            continue
        if not isinstance(item, str):
            raise LoggerError(
                f"a logger is a name ({', '.join(LOGGERS)}) or a Callback, got {item!r}"
            )
        name = item.strip().lower()
        if not name:
            continue
        if name in chosen:
            raise LoggerError(f"logger {name!r} is given twice")
        LOGGERS.get(name).check_available()
        chosen.append(name)
    return chosen


def logging_options(names: str | Sequence[str | Callback], log_every: int | None) -> list[str]:
    """The logger names in ``names``, checked (:func:`logger_names`), and ``log_every``
    (None: the default), which sets how often the named loggers read the loss and so is
    refused where none is named (a logger object has its own)."""
    chosen = [n for n in logger_names(names) if isinstance(n, str)]
    if log_every is not None:
        check_log_every(log_every)
        if not chosen:
            raise LoggerError(
                f"log_every={log_every!r} sets how often the loggers named in loggers= read "
                "the loss, and none is named; name one (loggers=['csv']) or leave log_every out"
            )
    return chosen


def check_log_directory(run_dir: Path, directory: Path) -> None:
    """Refuse, before any work, a logger directory under ``run_dir`` that is reached through
    a symbolic link (logs stay inside the run directory, never where a link points), that
    is a file, or that cannot be written."""
    here = run_dir
    for part in directory.relative_to(run_dir).parts:
        here = here / part
        if here.is_symlink():
            raise LoggerError(
                f"{here} is a symbolic link; the loggers write only inside the run directory, "
                "never where a link points: remove the link"
            )
        if here.exists() and not here.is_dir():
            raise LoggerError(f"{here} is a file, not a directory of logs: move it away")
        if not here.exists():
            here = here.parent
            break
    if not os.access(here, os.W_OK | os.X_OK):
        raise LoggerError(f"cannot write logs into {here}: permission denied")


def make_loggers(
    names: str | Sequence[str | Callback],
    run_dir: Path | str | None,
    *,
    log_every: int | None = None,
) -> list[Callback]:
    """The loggers named in ``names`` (as :func:`logger_names` reads them; Callback objects
    kept as they are), writing into ``run_dir/logs``, each reading the loss every
    ``log_every`` steps. Every name (:func:`logger_names`) and logger directory
    (:func:`check_log_directory`) is checked before any logger is made; a name with no
    ``run_dir`` (a learner without ``out=``) is a :class:`LoggerError`."""
    log_every = check_log_every(DEFAULT_LOG_EVERY if log_every is None else log_every)
    items = logger_names(names)
    chosen = [n for n in items if isinstance(n, str)]
    if chosen and run_dir is None:
        raise LoggerError(
            f"the {chosen[0]} logger writes into the run directory, and there is none: "
            f"give the learner out=DIR, or pass a logger object with its own directory, "
            f"e.g. espn.training.loggers.CSVLogger('logs')"
        )
    run = Path(run_dir or ".")
    for name in chosen:
        check_log_directory(run, run / "logs" / name)
    return [
        LOGGERS.get(n).in_run(run, log_every=log_every) if isinstance(n, str) else n for n in items
    ]
