"""``espn run``'s options, generated from their one declaration: a :class:`RunConfig` field or
an option a method declares (``Strategy.options``), so a new one is a flag with no change here."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from espn.settings.methods import known_options
from espn.utils.commands import run_dir_option

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

#: where ``espn run --help`` lists the flags the methods declare for themselves
METHOD_OPTIONS_PANEL = "Method options"
#: the fields that are not a flag of their own: the method's options, one flag each
NOT_FLAGS = ("method_options",)


def flag(name: str) -> str:
    """The command-line flag of an option, e.g. ``--batch-size``."""
    return "--" + name.replace("_", "-")


def _cli_type(annotation: Any) -> type:
    """The type typer parses a field as (``str`` for a tuple: ``"3,4,3"``)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is tuple:
        return str
    if annotation in (bool, int, float, str, Path):
        return typing.cast(type, annotation)
    raise TypeError(f"RunConfig field of type {annotation!r} has no command-line form")


def _option(name: str, kind: type, default: Any, **info: Any) -> inspect.Parameter:
    """The keyword-only typer option ``--name`` (``--name/--no-name`` for a bool)."""
    decl = f"{flag(name)}/--no-{flag(name)[2:]}" if kind is bool else flag(name)
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Option(default, decl, **info),
        annotation=kind if default is not None else kind | None,
    )


def field_parameter(name: str, field: FieldInfo) -> inspect.Parameter:
    """The typer option of one :class:`RunConfig` field."""
    kind = _cli_type(field.annotation)
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if extra.get("cli_required"):  # a directory the command line must name (read as text)
        return _option(name, str, ..., parser=run_dir_option, help=field.description)
    default = field.default if isinstance(field.default, kind) else None
    return _option(name, kind, default, help=field.description)


def run_option_parameters() -> list[inspect.Parameter]:
    """One option per :class:`RunConfig` field (but :data:`NOT_FLAGS`), then one per method
    option (read without loading torch)."""
    from espn.runs.config import RunConfig  # imports pydantic: only when the command is built

    fields = RunConfig.model_fields.items()
    return [field_parameter(name, f) for name, f in fields if name not in NOT_FLAGS] + [
        _option(
            name,
            option.type,
            None,
            help=f"{', '.join(methods)}: {option.help}, {option.accepted()}; "
            f"default {option.default}.",
            rich_help_panel=METHOD_OPTIONS_PANEL,
        )
        for name, (option, methods) in known_options().items()
    ]


def with_run_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a command taking ``**options``) with the signature typer reads: its own
    parameters plus one per run option and method option registered now."""
    fn.__signature__ = None  # type: ignore[attr-defined]  # its own, not the last one given
    own = inspect.signature(fn)
    fixed = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
    context = [p for p in fixed if p.annotation in (typer.Context, "typer.Context")]
    switches = [p.replace(kind=p.KEYWORD_ONLY) for p in fixed if p not in context]
    generated = run_option_parameters()
    fn.__signature__ = own.replace(parameters=[*context, *generated, *switches])  # type: ignore[attr-defined]
    return fn
