"""What a checkpoint stores and how many bytes each part takes, read from the manifest and the
safetensors headers alone (no tensor loaded, no model code imported), so that ``espn info``
reads any run (docs/checkpoints.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from espn.checkpoint.format import CheckpointError, read_manifest, verify_file


def tensor_bytes(path: Path) -> dict[str, int]:
    """Bytes of each tensor of a safetensors file, from its header: an 8-byte little-endian
    length, then a JSON object giving each tensor's ``data_offsets`` (begin, end) in the file."""
    try:
        with path.open("rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        return {
            key: int(entry["data_offsets"][1]) - int(entry["data_offsets"][0])
            for key, entry in header.items()
            if key != "__metadata__"
        }
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint file {path} cannot be read: {exc}") from None


def _sum(sizes: dict[str, int], *prefixes: str) -> int:
    return sum(n for k, n in sizes.items() if k.startswith(prefixes))


@dataclass(frozen=True)
class StoredTask:
    """One committed task as stored: its manifest entry and the bytes of its stored masks
    (weight masks and bit-packed unit masks), task state (gates or BatchNorm, head) and own
    weights; ``file`` is the size of its file."""

    entry: dict[str, Any]
    mask_bytes: int
    state_bytes: int
    own_bytes: int
    file: int

    @property
    def record(self) -> dict[str, Any]:
        """The task's record as the run wrote it (FLOPs ratio, weights used, ...)."""
        return dict(self.entry.get("record") or {})

    @property
    def forms(self) -> list[str]:
        """The forms its weight masks are stored in (a version-1 checkpoint: all bits)."""
        return sorted(set(self.entry.get("masks", {}).values()) or {"bits"})

    @property
    def nbytes(self) -> int:
        """The task's own bytes: masks, state and own weights."""
        return self.mask_bytes + self.state_bytes + self.own_bytes


@dataclass(frozen=True)
class StoredRun:
    """A checkpoint's parts and their sizes (see :func:`read_sizes`)."""

    directory: Path
    manifest: dict[str, Any]
    tasks: list[StoredTask]
    #: bytes of the state file's shared weights, owner ids, and the whole state file
    weight_bytes: int
    owner_bytes: int
    state_file: int
    files: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Bytes on disk: every file the manifest names, and the manifest."""
        return sum(self.files.values())


def read_sizes(directory: Path | str) -> StoredRun:
    """The checkpoint in ``directory`` part by part, with its sizes: the manifest validated
    and every file checked against it (size and SHA-256), tensors read from the headers."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    files = {"manifest.json": (directory / "manifest.json").stat().st_size}
    tasks = []
    for entry in manifest["tasks"]:
        sizes = tensor_bytes(verify_file(directory, entry))
        files[entry["file"]] = int(entry["bytes"])
        tasks.append(
            StoredTask(
                entry,
                mask_bytes=_sum(sizes, "weights.", "units."),
                state_bytes=_sum(sizes, "state."),
                own_bytes=_sum(sizes, "own."),
                file=int(entry["bytes"]),
            )
        )
    state = tensor_bytes(verify_file(directory, manifest["state"]))
    files[manifest["state"]["file"]] = int(manifest["state"]["bytes"])
    return StoredRun(
        directory,
        manifest,
        tasks,
        weight_bytes=_sum(state, "shared."),
        owner_bytes=_sum(state, "owner."),
        state_file=int(manifest["state"]["bytes"]),
        files=files,
    )
