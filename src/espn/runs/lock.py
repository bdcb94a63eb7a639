"""A Python learner's hold on its run directory: the lock ``espn run`` takes, held for the
learner that writes it now (see :class:`DirectoryLock`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from espn.checkpoint.format import CheckpointError
from espn.checkpoint.lock import LOCK_FILE, RunLocked, holder, run_lock

#: run directories whose lock a learner of this process holds: resolved path -> the lock
#: (entered) and the :class:`DirectoryLock` it is held for now
_HELD: dict[Path, tuple[AbstractContextManager[Path], DirectoryLock]] = {}


class DirectoryLockError(CheckpointError):
    """A learner's run directory is written by another process, or by a newer learner of
    this process."""


class DirectoryLock:
    """A Python learner's hold on its run directory (``out=``): the lock ``espn run`` takes
    (:func:`espn.checkpoint.lock.run_lock`), so that a second process with the same
    directory is refused at once. A newer learner of the same process on the same directory
    (a notebook cell run again) takes the lock over, and the older one may no longer learn
    into it. Released by :meth:`release` (the learner's ``close()``) or when the process
    ends; :meth:`check` takes it again for a learner that learns after ``close()``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.key = out.resolve()
        self.check(take_over=True)

    def check(self, take_over: bool = False) -> None:
        """Hold the lock (take it if nobody in this process does); refuse if another
        process holds it, or, unless ``take_over``, a newer learner of this process."""
        held = _HELD.get(self.key)
        if held is not None and held[1] is not self and not take_over:
            raise DirectoryLockError(
                f"{self.out} is written by a newer ContinualLearner of this process (one "
                "made later with the same out=); learn with that one"
            )
        if held is not None:
            _HELD[self.key] = (held[0], self)
            return
        lock = run_lock(self.out)
        try:
            lock.__enter__()
        except RunLocked:
            raise DirectoryLockError(
                f"{self.out} is in use by another process ({holder(self.out / LOCK_FILE)}); "
                "wait for it to end, or pass another out="
            ) from None
        _HELD[self.key] = (lock, self)

    def release(self) -> None:
        """Give the lock up, if this learner holds it."""
        held = _HELD.get(self.key)
        if held is not None and held[1] is self:
            del _HELD[self.key]
            held[0].__exit__(None, None, None)
