"""Presets: named run recipes stored as JSON files in this package (``espn presets``).

A preset file holds ``{"description": "...", "config": {option: value, ...}}`` where the
options are those of :class:`espn.config.RunConfig` (``benchmark``, ``model``, ``epochs``,
``lr``, ...). ``--preset NAME`` applies one of the files shipped here; ``--preset PATH.json``
applies a file of the user's. Options given explicitly win over the preset, which wins over
the benchmark's defaults.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from espn.errors import EspnError
from espn.registry import UnknownNameError

#: options a preset may not set (they name the run itself)
NOT_IN_PRESETS = ("preset", "out")


class PresetError(EspnError, ValueError):
    """A preset file is malformed; the message names the file and the problem."""


def _shipped() -> dict[str, Any]:
    return {
        entry.name.removesuffix(".json"): entry
        for entry in resources.files(__name__).iterdir()
        if entry.name.endswith(".json")
    }


def preset_names() -> list[str]:
    """Names of the presets shipped with espn, sorted."""
    return sorted(_shipped())


def _read(name: str) -> tuple[str, dict[str, Any]]:
    shipped = _shipped()
    if name in shipped:
        return f"preset {name!r}", json.loads(shipped[name].read_text())
    path = Path(name)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise PresetError(f"preset file {path} does not exist")
        try:
            return f"preset file {path}", json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise PresetError(f"preset file {path} is not valid JSON ({exc})") from None
    raise UnknownNameError(
        f"unknown preset {name!r}; choose one of: {', '.join(preset_names())} "
        "(or give the path of a .json preset file)"
    )


def load_preset(name: str) -> dict[str, Any]:
    """The options set by preset ``name`` (a shipped preset or a ``.json`` file path)."""
    where, doc = _read(name)
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise PresetError(f'{where} must be a JSON object with a "config" object of options')
    values = dict(doc["config"])
    banned = [k for k in values if k in NOT_IN_PRESETS]
    if banned:
        raise PresetError(f"{where} may not set {', '.join(banned)}")
    return values


def describe(name: str) -> str:
    """The one-line description of preset ``name``."""
    return str(_read(name)[1].get("description", ""))


def merge(preset: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """Options of a run: those ``given`` (not None) over the ``preset``'s."""
    return preset | {k: v for k, v in given.items() if v is not None}
