"""What a checkpoint stores and how many bytes each part takes, read from storage alone: the
manifest (every task's record, mask forms and file) and the safetensors headers of its
files (each tensor's shape and dtype). No tensor is loaded, no supernet built, no model code
imported: ``espn info`` reads any run this way, also one whose model only its author's code
can build."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from espn.checkpoint.format import CheckpointError, read_manifest, verify_file

#: bytes per element of each safetensors dtype
ITEM_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


def tensor_bytes(path: Path) -> dict[str, int]:
    """Bytes of each tensor of a safetensors file, from its header (shapes and dtypes)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            out = {}
            for key in f.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                part = f.get_slice(key)
                dtype = part.get_dtype()
                if dtype not in ITEM_BYTES:
                    raise CheckpointError(f"checkpoint file {path}: tensor {key!r} is {dtype}")
                out[key] = math.prod(part.get_shape()) * ITEM_BYTES[dtype]
            return out
    except (SafetensorError, OSError) as exc:
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
