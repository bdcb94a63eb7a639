"""Run checkpoints: shared weights once, packed per-task masks and state, a JSON manifest."""

from espn.checkpoint.format import (
    FORMAT_VERSION,
    CheckpointError,
    checkpoint_dir,
)
from espn.checkpoint.store import (
    Checkpoint,
    CheckpointWriter,
    TrainingState,
    read_checkpoint,
    restore,
)

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "CheckpointWriter",
    "TrainingState",
    "checkpoint_dir",
    "read_checkpoint",
    "restore",
]
