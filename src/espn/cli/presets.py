"""``espn presets``: list the shipped run recipes, or show the options one sets."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from espn.runs.config import RunConfig, make_config
from espn.runs.given import check_applicable
from espn.settings.presets import describe, load_preset, preset_names
from espn.utils.commands import command_group, console, user_errors

app = command_group(
    help="Named run recipes for `espn run --preset NAME` (options given explicitly win).",
    invoke_without_command=True,
    no_args_is_help=False,
)


@app.callback()
def presets(ctx: typer.Context) -> None:
    """List the presets (``espn presets show NAME`` prints the options one sets)."""
    if ctx.invoked_subcommand is not None:
        return
    table = Table("preset", "description")
    for name in preset_names():
        table.add_row(name, describe(name))
    console.print(table)


@app.command()
@user_errors
def show(
    name: str = typer.Argument(..., help="A preset name or a .json/.yaml preset file."),
) -> None:
    """Print the options preset NAME sets, as JSON: save it to a file, edit it and run it with
    `espn run --preset FILE.json`."""
    typer.echo(json.dumps(load_preset(name), indent=2))


def make_config_given(ctx: typer.Context, **values: Any) -> RunConfig:
    """``make_config`` from the options given on the command line (those left at their
    default are dropped, for a preset and the recipes to fill in)."""

    def defaulted(name: str) -> bool:
        source = ctx.get_parameter_source(name)  # typer may vendor click: compare by name
        return source is not None and source.name in ("DEFAULT", "DEFAULT_MAP")

    given = {k: v for k, v in values.items() if k not in ctx.params or not defaulted(k)}
    cfg = make_config(**given)
    check_applicable(given, cfg)
    return cfg
