"""Experiment loggers: CSV, TensorBoard and W&B, each a callback of the learner.

``espn run --log tensorboard,csv`` and ``ContinualLearner(..., loggers=[...])`` build them
with :func:`make_loggers`; each writes into ``RUN/logs/``. Every logger records the same
things (see :mod:`espn.loggers.base`): the loss and learning rate every ``log_every`` steps
with the phase, each epoch's loss, and per learned task its accuracy row, FLOPs ratio, weights
used and added, and wall time. TensorBoard and W&B are optional extras
(``pip install 'espn[tensorboard]'``, ``'espn[wandb]'``); asking for one that is not installed
is an error naming the extra, raised before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from espn.loggers.base import (
    DEFAULT_LOG_EVERY,
    LoggerError,
    LoggerUnavailable,
    MetricLogger,
    check_log_every,
)
from espn.loggers.csv_logger import CSVLogger
from espn.loggers.tensorboard_logger import TensorBoardLogger
from espn.loggers.wandb_logger import WandbLogger
from espn.registry import Registry
from espn.training.callbacks import Callback

#: the loggers ``--log`` accepts, by name
LOGGERS: Registry[type[MetricLogger]] = Registry("logger")
for _cls in (CSVLogger, TensorBoardLogger, WandbLogger):
    LOGGERS.register(_cls.name)(_cls)

__all__ = [
    "DEFAULT_LOG_EVERY",
    "LOGGERS",
    "CSVLogger",
    "LoggerError",
    "LoggerUnavailable",
    "MetricLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "logger_names",
    "make_loggers",
]


def logger_names(names: str | Sequence[str | Callback]) -> list[str]:
    """The logger names in ``names`` (``"tensorboard,csv"`` or a list of names), checked:
    each known, none twice, its optional extra installed. Callbacks in a list are skipped."""
    items = names.split(",") if isinstance(names, str) else list(names)
    chosen: list[str] = []
    for item in items:
        if isinstance(item, Callback):
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


def make_loggers(
    names: str | Sequence[str | Callback],
    run_dir: Path | str | None,
    *,
    log_every: int = DEFAULT_LOG_EVERY,
) -> list[Callback]:
    """The loggers named in ``names`` (``"tensorboard,csv"``, or a list of names and
    :class:`~espn.training.callbacks.Callback` objects, which are kept as they are), writing
    into ``run_dir/logs``, each reading the loss every ``log_every`` steps.

    Every name is checked before any logger is made: an unknown one is an error listing the
    accepted names, one given twice a :class:`LoggerError`, one whose optional extra is
    missing a :class:`LoggerUnavailable` naming the extra; a name with no ``run_dir`` (a
    learner without ``out=``) is a :class:`LoggerError` too.
    """
    check_log_every(log_every)
    chosen = logger_names(names)
    if chosen and run_dir is None:
        raise LoggerError(
            f"the {chosen[0]} logger writes into the run directory, and there is none: "
            f"give the learner out=DIR, or pass a logger object with its own directory, "
            f"e.g. espn.loggers.CSVLogger('logs')"
        )
    items = names.split(",") if isinstance(names, str) else list(names)
    made: list[Callback] = []
    for item in items:
        if isinstance(item, Callback):
            made.append(item)
        elif item.strip() and run_dir is not None:
            cls = LOGGERS.get(item.strip().lower())
            made.append(cls.in_run(Path(run_dir), log_every=log_every))
    return made
