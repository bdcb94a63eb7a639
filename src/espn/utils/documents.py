"""Reading the JSON and YAML files a user writes (sweep specs, presets): one reader, one set of
clear errors naming the file and what is accepted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from espn.errors import EspnError
from espn.utils.io import MAX_JSON_DEPTH, nests_deeper

if TYPE_CHECKING:
    from pydantic import ValidationError

#: the most values (numbers, strings, list items) a document may hold once YAML aliases are
#: expanded: a few hundred bytes of nested aliases would otherwise expand to gigabytes
MAX_VALUES = 100_000


def load_document(path: Path, what: str, error: type[EspnError]) -> Any:
    """The contents of ``path``, a ``.json``, ``.yaml`` or ``.yml`` file; anything else (a
    missing file, a directory, a device or FIFO, bad syntax, another suffix, nesting deeper
    than results.json's :data:`~espn.utils.io.MAX_JSON_DEPTH` levels) raises ``error`` naming
    ``what`` (e.g. "sweep spec") and the file."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{what} {path} is a directory; give a .json or .yaml file")
    if not path.exists():
        raise error(f"{what} {path} does not exist (give a .json or .yaml file)")
    if not path.is_file():  # a device (/dev/zero) or a FIFO: reading it may never end
        raise error(f"{what} {path} is not a regular file; give a .json or .yaml file")
    suffix = path.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise error(f"{what} {path}: unknown format {suffix!r}; use .json, .yaml or .yml")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not a text file (UTF-8 JSON or YAML)") from None
    deep = error(f"{what} {path} nests deeper than the {MAX_JSON_DEPTH} levels espn reads")
    parse: Callable[[str], Any] = json.loads
    invalid: type[Exception] = json.JSONDecodeError
    if suffix != ".json":
        try:
            import yaml
        except ImportError:
            raise error(
                f"reading {path} needs PyYAML: pip install pyyaml (or 'espn[ray]'), or write "
                f"the {what} as .json"
            ) from None
        parse, invalid = yaml.safe_load, yaml.YAMLError
    try:
        doc = parse(text)
    except invalid as exc:
        kind = "JSON" if suffix == ".json" else "YAML"
        raise error(f"{what} {path} is not valid {kind}: {exc}") from None
    except RecursionError:
        raise deep from None
    if suffix != ".json":  # only YAML's aliases repeat parts of a document
        check_size(doc, what, error)
    if nests_deeper(doc, MAX_JSON_DEPTH):
        raise deep
    return doc


def check_size(value: Any, what: str, error: type[EspnError]) -> None:
    """Refuse a document holding more than :data:`MAX_VALUES` values once shared parts (YAML
    aliases) are counted each time they are used; stops counting there, so it is fast."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise error(
                f"{what}: more than {MAX_VALUES} values once its YAML aliases are expanded; "
                "write the values out, or split it"
            )
        if isinstance(item, dict):
            stack += [*item, *item.values()]
        elif isinstance(item, list | tuple):
            stack.extend(item)


def describe_errors(exc: ValidationError, subject: str, limit: int | None = None) -> str:
    """Pydantic's validation errors (the first ``limit``) as one line of ``where: what``,
    with the value given where pydantic's message does not name it; ``subject`` stands for
    where an error about the whole document is."""
    errors = exc.errors()
    parts = []
    for err in errors[:limit]:
        where = ".".join(str(p) for p in err["loc"]) or subject
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "finite_number":
            msg = f"must be a finite number, got {err['input']!r}"
        elif err["type"] not in ("value_error", "missing"):
            msg += f" (got {repr(err.get('input'))[:60]})"
        parts.append(f"{where}: {msg}")
    more = len(errors) - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more else "")
