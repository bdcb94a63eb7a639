"""Run checkpoints: shared weights once, packed per-task masks and state, a JSON manifest.

This package only reads and writes the files (safetensors, JSON, a lock file); deciding
what to build from them, resuming and loading runs, is :mod:`espn.runs`'."""

from espn.checkpoint.format import (
    FORMAT_VERSION,
    CheckpointError,
    checkpoint_dir,
)
from espn.checkpoint.reader import read_checkpoint, restore, restore_working
from espn.checkpoint.store import (
    Checkpoint,
    CheckpointWriter,
    TrainingSnapshot,
    TrainingState,
)

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "CheckpointWriter",
    "TrainingSnapshot",
    "TrainingState",
    "checkpoint_dir",
    "read_checkpoint",
    "restore",
    "restore_working",
]
