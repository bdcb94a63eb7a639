"""``espn presets``: list the shipped run recipes, or show the options one sets."""

from __future__ import annotations

import json

import typer
from rich.table import Table

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
