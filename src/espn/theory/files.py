"""Atomic output files of the theory lab, with ordinary (umask) permissions."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from espn.utils.io import atomic_target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_file(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``.

    Like :func:`espn.utils.io.atomic_target` (temp file in the same directory, then
    ``os.replace``), but the result gets the usual ``0o666 & ~umask`` mode instead
    of the private mode of a temporary file.
    """
    with atomic_target(path) as tmp:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())


def write_json(path: Path | str, data: object) -> Path:
    """Write ``data`` as indented JSON, atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
    return Path(path)
