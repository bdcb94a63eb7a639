"""Helpers shared by the CLI commands: clear errors and a non-zero exit."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer
from rich.console import Console

from espn.checkpoint.format import CheckpointError
from espn.config import ConfigError
from espn.data.sources import DatasetUnavailable
from espn.registry import UnknownNameError
from espn.supernet.pretrained import PretrainedError

err_console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

USER_ERRORS = (
    ConfigError,
    CheckpointError,
    DatasetUnavailable,
    UnknownNameError,
    PretrainedError,
    FileNotFoundError,
)


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` to stderr and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def user_errors(fn: F) -> F:
    """Turn the errors a user can fix into a one-line message and exit status 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            fail(str(exc))

    return wrapper  # type: ignore[return-value]


def parse_epochs(text: str | None) -> tuple[int, ...] | None:
    """``"3,4,3"`` -> (3, 4, 3): pre-train, prune and fine-tune epochs."""
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise ConfigError(
            f"--epochs must be three comma-separated integers PRE,PRUNE,FINE (e.g. 3,4,3), got {text!r}"
        )
    return values
