"""Helpers shared by the CLI commands: :func:`user_errors`, the one place where an exception
becomes one ``error: ...`` line and an exit status (docs/limits.md), and consoles and command
groups that print text as written (no rich markup).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.text import Text
from typer.exceptions import TyperException

from espn.errors import EspnError
from espn.utils.io import os_error_text
from espn.utils.text import OutputConsole, printable

#: the CLI's output and its messages, printed as written (no rich markup)
console = OutputConsole(markup=False)
err_console = OutputConsole(stderr=True, markup=False)
F = TypeVar("F", bound=Callable[..., Any])

#: exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it)
INTERRUPTED = 130


class UserError(EspnError, ValueError):
    """An error a user can fix; the message says what was wrong and what is accepted."""


class RunInterrupted(Exception):
    """A run stopped by Ctrl-C; the message says where its checkpoint is and how to resume."""


_debug = False


def set_debug(on: bool) -> None:
    """Show tracebacks instead of one-line errors (``espn --debug``)."""
    global _debug
    _debug = on


def command_group(**settings: Any) -> typer.Typer:
    """A typer app whose help texts reach the terminal as written (no rich markup), without
    typer's shell-completion options."""
    settings.setdefault("add_completion", False)
    return typer.Typer(rich_markup_mode=None, pretty_exceptions_enable=False, **settings)


def labelled(label: str, style: str, message: str) -> Text:
    """``label message`` with only the label styled; ``message`` is printed as written, its
    terminal control characters escaped (it may quote a file, see :mod:`espn.utils.text`)."""
    return Text.assemble((label, style), " ", printable(message))


def warn(message: str) -> None:
    """Print ``warning: message`` to stderr as one line."""
    err_console.print(labelled("warning:", "yellow", message), highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` to stderr as one line and exit with ``code``."""
    err_console.print(labelled("error:", "bold red", message), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def os_error_message(exc: OSError) -> str:
    """A file-system error as one line naming the path and what to do."""
    where = f" {exc.filename}" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return f"no space left on device{where}; free some space and retry"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write{where}: {exc.strerror or exc} (choose a writable location)"
    return os_error_text(exc)


def handle(exc: BaseException) -> None:
    """Turn ``exc`` into one line on stderr and the matching exit status."""
    env = os.environ.get("ESPN_DEBUG", "").strip().lower()
    debug = _debug or env not in ("", "0", "false", "no", "off")
    # typer's own exceptions (usage errors) pass; --debug or ESPN_DEBUG=1 shows the traceback
    if debug or isinstance(exc, (typer.Exit, typer.Abort, TyperException)):
        raise exc
    if isinstance(exc, RunInterrupted):
        fail(str(exc), INTERRUPTED)
    if isinstance(exc, KeyboardInterrupt):
        fail("interrupted", INTERRUPTED)
    if isinstance(exc, EspnError):
        fail(str(exc))
    if isinstance(exc, OSError):
        fail(os_error_message(exc))
    if isinstance(exc, MemoryError):
        fail(f"out of memory ({exc}); use smaller sizes (batch, image size, tasks)")
    if isinstance(exc, Exception):
        fail(
            f"unexpected {type(exc).__name__}: {exc} (a bug in espn; rerun with "
            "`espn --debug ...` or ESPN_DEBUG=1 for the traceback and report it)",
            code=1,
        )
    raise exc


def user_errors(fn: F) -> F:
    """The CLI's one error handler around a command: an exception becomes one ``error: ...``
    line on stderr and exit status 2 (what a user can fix), 130 (interrupted) or 1 (a bug);
    ``--debug`` or ``ESPN_DEBUG=1`` shows the traceback instead."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            handle(exc)

    return wrapper  # type: ignore[return-value]


def run_dir_option(text: str) -> Path:
    """``--out`` / ``--run`` as a path; an empty one is refused (it would mean ``.``)."""
    if not text.strip():
        raise typer.BadParameter("must name a directory, got an empty string")
    return Path(text)


RUN_HELP = "Run directory (the --out of `espn run`), holding checkpoint/ and results.json."
#: the run directory of ``show``, ``info``, ``evaluate`` and ``export``: positional (``espn info
#: DIR``) for every command that reads a run ...
RUN_ARGUMENT = typer.Argument(
    None, parser=run_dir_option, metavar="RUN_DIR", help=RUN_HELP, show_default=False
)
#: ... and ``--run DIR``, the same, kept for scripts written for the option
RUN_ALIAS = typer.Option(None, "--run", parser=run_dir_option, help="Same as RUN_DIR (an alias).")


def run_directory(positional: Path | None, alias: Path | None) -> Path:
    """The run directory a command was given, as ``DIR`` or as ``--run DIR`` (one of them,
    or both naming the same directory); anything else is refused before any work."""
    path = positional or alias
    if path is None:
        raise UserError("missing the run directory: give it as RUN_DIR (the --out of `espn run`)")
    if alias is not None and alias != path:
        raise UserError(
            f"two run directories given, {str(path)!r} and --run {str(alias)!r}; give one"
        )
    return path


#: the options of how a sweep's points run, shared by ``espn sweep`` and ``espn reproduce``
#: (:class:`espn.sweep.SweepOptions`)
WORKERS_OPTION = typer.Option(
    None,
    help="Points run at once: N > 1 on an embedded local Ray of N workers; default 1: one "
    "after another in this process, no Ray started (unless --ray-address or RAY_ADDRESS).",
)
RAY_ADDRESS_OPTION = typer.Option(
    None,
    help="Run on this existing Ray cluster: its head's host:port, or auto "
    "(ray://host:port needs the Ray client: Ray's client extra).",
)
CPUS_PER_RUN_OPTION = typer.Option(1.0, help="CPUs Ray reserves for each point.")
POINT_PROGRESS_OPTION = typer.Option(True, help="Bar over points and a line per finished point.")
OVERWRITE_POINTS_OPTION = typer.Option(
    False, help="Replace points whose directory holds a run made with other options."
)
