"""Atomic file writes: write to a temporary file beside the target, then rename."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_target(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s directory; it replaces ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path | str, data: object) -> None:
    """Write ``data`` as indented JSON, atomically."""
    with atomic_target(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")


def os_error_text(exc: OSError) -> str:
    """A file-system error in a few words: its reason and path (``No space left on device``)."""
    reason = exc.strerror or str(exc)
    return f"{reason}: {exc.filename}" if exc.filename else reason
