"""The on-disk format of a run's checkpoint (``<run>/checkpoint``): file names, version and
integrity checks; the layout and the atomic writes: docs/checkpoints.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

from espn.errors import EspnError
from espn.supernet.supernet import Supernet
from espn.utils.io import JsonFileError, read_json

FORMAT_NAME = "espn-checkpoint"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
CHECKPOINT_DIR = "checkpoint"


class CheckpointError(EspnError, ValueError):
    """A checkpoint cannot be used: missing, truncated, corrupted, too new, or of another model."""


def checkpoint_dir(run_dir: Path | str) -> Path:
    """The checkpoint directory of a run directory."""
    return Path(run_dir) / CHECKPOINT_DIR


def task_file(index: int) -> str:
    """File name of task ``index``'s masks, BatchNorm and head."""
    return f"task-{index:04d}.safetensors"


def state_file(generation: int) -> str:
    """File name of the shared state written by save number ``generation``."""
    return f"state-{generation:06d}.safetensors"


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in blocks (the manifest's integrity check)."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    """Name, size and SHA-256 of a checkpoint file, as the manifest records it."""
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256_of(path)}


def fsync_dir(directory: Path) -> None:
    """Make renames in ``directory`` durable, where the platform can fsync a directory (not
    Windows, some network mounts: there as durable as the OS makes them)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def architecture(supernet: Supernet) -> dict[str, Any]:
    """What must match for a checkpoint to load into ``supernet``: layer shapes, unit groups,
    task modules (names and classes)."""
    return {
        "layers": {n: list(layer.weight.shape) for n, layer in supernet.layers.items()},
        "groups": dict(supernet.group_sizes),
        "task_modules": {n: type(m).__name__ for n, m in supernet.task_modules.items()},
    }


def check_architecture(expected: dict[str, Any], supernet: Supernet, model: str) -> None:
    """Refuse a checkpoint whose architecture differs from ``supernet``'s, naming a difference."""
    actual = architecture(supernet)
    for key in ("layers", "groups", "task_modules"):
        want, have = expected.get(key, {}), actual[key]
        if want == have:
            continue
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        if missing or extra:
            what = f"{key} {missing or extra} only in the {'checkpoint' if missing else 'model'}"
        else:
            name = next(n for n in want if want[n] != have[n])
            what = f"{key[:-1]} {name!r} is {want[name]} in the checkpoint, {have[name]} here"
        raise CheckpointError(
            f"the checkpoint does not fit this {model} supernet ({what}); "
            "it was written for another model or width"
        )


def read_manifest(directory: Path) -> dict[str, Any]:
    """Load and validate ``manifest.json`` (format, version, required fields)."""
    path = directory / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"no checkpoint in {directory} ({MANIFEST} not found)")
    try:
        manifest = read_json(path)
    except JsonFileError as exc:
        if exc.syntax is None:  # beyond a size limit
            raise CheckpointError(str(exc)) from None
        raise CheckpointError(
            f"{path} is truncated or corrupted (not valid JSON: {exc.syntax})"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{path} is not an espn checkpoint manifest")
    version = manifest.get("format_version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {version}, newer than this espn "
            f"reads (<= {FORMAT_VERSION}); upgrade espn to load it"
        )
    from pydantic import ValidationError

    from espn.checkpoint.manifest import Manifest
    from espn.utils.documents import describe_errors

    try:
        Manifest.model_validate(manifest)
    except ValidationError as exc:
        what = describe_errors(exc, "manifest", limit=3)
        raise CheckpointError(f"{path} does not match the checkpoint format: {what}") from None
    return manifest


def manifest_or_none(directory: Path) -> dict[str, Any] | None:
    """:func:`read_manifest`, or None where there is no readable, valid manifest (for
    messages and checks that only ask whether there is a checkpoint and what it holds)."""
    try:
        return read_manifest(directory)
    except (CheckpointError, OSError):
        return None


def verify_file(directory: Path, entry: dict[str, Any]) -> Path:
    """The path of a file the manifest names, after checking that it lies directly in
    ``directory`` (no other directory, no link out of it), its size and its SHA-256."""
    path = directory / entry["file"]
    if path.resolve().parent != directory.resolve() or path.is_symlink():
        raise CheckpointError(
            f"checkpoint file {entry['file']!r} is not a file inside {directory}; refused"
        )
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise CheckpointError(
            f"checkpoint file {path} is truncated or corrupted "
            f"({size} bytes, the manifest says {entry['bytes']})"
        )
    if sha256_of(path) != entry["sha256"]:
        raise CheckpointError(
            f"checkpoint file {path} is corrupted (its SHA-256 differs from the manifest's)"
        )
    return path
