"""Presets: named run recipes stored as JSON files in this package (``espn presets``), or a
user's ``.json``/``.yaml`` file of ``espn run`` options (docs/cli.md, presets).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from espn.errors import EspnError
from espn.registry import UnknownNameError
from espn.utils.documents import load_document

#: the suffixes of preset files (JSON or YAML, as sweep specs)
FILE_SUFFIXES = (".json", ".yaml", ".yml")
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


def _read(name: str) -> tuple[str, Any]:
    shipped = _shipped()
    if name in shipped:
        return f"preset {name!r}", json.loads(shipped[name].read_text())
    path = Path(name)
    if path.suffix.lower() in FILE_SUFFIXES or path.exists():
        return f"preset file {path}", load_document(path, "preset file", PresetError)
    raise UnknownNameError(
        f"unknown preset {name!r}; choose one of: {', '.join(preset_names())} "
        "(or give the path of a .json or .yaml preset file)"
    )


def load_preset(name: str) -> dict[str, Any]:
    """The options set by preset ``name``: a shipped preset, or a ``.json`` / ``.yaml`` file
    holding the options themselves (as ``espn presets show`` prints them) or
    ``{"description": ..., "config": {options}}``."""
    where, doc = _read(name)
    wrapped = isinstance(doc, dict) and "config" in doc
    values = doc.get("config") if wrapped else doc
    if not isinstance(values, dict):
        raise PresetError(
            f"{where} must be a mapping of options (as `espn presets show` prints them) or "
            '{"description": "...", "config": {options}}'
        )
    if wrapped:
        extra = sorted(set(doc) - {"description", "config"})
        if extra:
            raise PresetError(
                f'{where} has {", ".join(map(repr, extra))} beside "config"; only '
                '"description" may be there'
            )
    values = {k: v for k, v in values.items() if wrapped or k != "description"}
    banned = [k for k in values if k in NOT_IN_PRESETS]
    if banned:
        raise PresetError(f"{where} may not set {', '.join(banned)}")
    return values


def describe(name: str) -> str:
    """The one-line description of preset ``name``."""
    doc = _read(name)[1]
    return str(doc.get("description", "")) if isinstance(doc, dict) else ""
