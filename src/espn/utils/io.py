"""Atomic file writes (every file espn writes goes through :func:`atomic_target`: a crash never
leaves a half-written file) and CSV files."""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from espn.errors import EspnError

#: the largest JSON file espn reads from a run directory (a results.json of thousands of
#: tasks is a few MiB), and its deepest nesting (espn writes at most 6 levels)
MAX_JSON_BYTES = 64 * 2**20
MAX_JSON_DEPTH = 64


@contextmanager
def atomic_target(path: Path | str, *, keep_suffix: bool = False) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s directory; it replaces ``path`` on success.

    The result gets the usual ``0o666 & ~umask`` mode (not the private mode of a temporary
    file). ``keep_suffix`` ends the temporary name with ``path``'s suffix, for writers that
    choose the format from the file name (``.tmp.onnx``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = ".tmp" + (path.suffix if keep_suffix else "")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path | str, data: object) -> None:
    """Write ``data`` as indented JSON, atomically."""
    with atomic_target(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")


class JsonFileError(EspnError, ValueError):
    """A JSON file is not JSON, or beyond :data:`MAX_JSON_BYTES` or :data:`MAX_JSON_DEPTH`;
    the message names the file and says which (``syntax``: the parser's words, when it is
    not valid JSON)."""

    def __init__(self, message: str, syntax: str | None = None) -> None:
        super().__init__(message)
        self.syntax = syntax


def read_json(path: Path | str) -> Any:
    """The JSON document in ``path``, refused (:class:`JsonFileError`) before it is read if the
    file is larger than :data:`MAX_JSON_BYTES`, and once parsed if it nests deeper than
    :data:`MAX_JSON_DEPTH` (so a small hostile file cannot exhaust memory or the stack);
    ``OSError`` as ``open`` raises it."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise JsonFileError(
            f"{path} is {size} bytes, larger than the {MAX_JSON_BYTES} espn reads; refused"
        )
    deep = JsonFileError(
        f"{path} nests JSON deeper than the {MAX_JSON_DEPTH} levels espn reads; refused"
    )
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except RecursionError:
        raise deep from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JsonFileError(f"{path} is not valid JSON ({exc})", syntax=str(exc)) from None
    if nests_deeper(doc, MAX_JSON_DEPTH):
        raise deep
    return doc


def nests_deeper(doc: Any, limit: int) -> bool:
    """Whether ``doc`` holds lists or objects nested more than ``limit`` deep (no recursion)."""
    stack = [(doc, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def write_csv(path: Path | str, rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    """Write ``rows`` (only ``columns``, in that order, with a header) to ``path`` atomically.

    Floats are written with their shortest exact text (``repr``), so they read back equal.
    """
    path = Path(path)
    with atomic_target(path) as tmp, tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_cell(row.get(k)) for k in columns})
    return path


def _csv_cell(value: Any) -> Any:
    return repr(float(value)) if isinstance(value, float) else value


def read_csv(path: Path | str) -> list[dict[str, str]]:
    """The rows of a CSV file with a header, as text (callers convert the cells they know)."""
    with Path(path).open(newline="") as fh:
        return list(csv.DictReader(fh))


def os_error_text(exc: OSError) -> str:
    """A file-system error in a few words: its reason and path (``No space left on device``)."""
    reason = exc.strerror or str(exc)
    return f"{reason}: {exc.filename}" if exc.filename else reason
