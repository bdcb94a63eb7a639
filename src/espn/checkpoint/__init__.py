"""Run checkpoints: shared weights once, packed per-task masks and state, a JSON manifest.
Only the files are read and written here; what to build from them is :mod:`espn.runs`'."""

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
