"""Atomic file writes (write to a temporary file beside the target, then rename) and CSV files.

Every file espn writes goes through :func:`atomic_target`, so a crash or a full disk never
leaves a half-written result, checkpoint, figure or export behind.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path | str, data: object) -> None:
    """Write ``data`` as indented JSON, atomically."""
    with atomic_target(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")


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
