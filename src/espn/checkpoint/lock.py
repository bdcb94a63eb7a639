"""One run at a time per run directory: ``<out>/.espn-run.lock``, held with ``fcntl.flock``
while a run lasts (the kernel drops it when its process dies, so a stale file is taken over).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from espn.checkpoint.format import CheckpointError
from espn.utils.io import read_json

LOCK_FILE = ".espn-run.lock"


class RunLocked(CheckpointError):
    """Another process is running in the same run directory."""


def prepare_out_dir(out: Path | str) -> Path:
    """Create the run directory (and its parents) or say in one line why it cannot be."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"--out {out} is a file, not a directory; choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise CheckpointError(
            f"--out {out}: a part of the path is a file, not a directory; choose another --out"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"cannot create --out {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot write into --out {out}: permission denied")
    return out


def holder(path: Path) -> str:
    """Who holds the lock file ``path``: its pid, host and start time, as it records them."""
    try:
        info = read_json(path)
        return f"pid {info['pid']} on {info['host']}, since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextmanager
def run_lock(out: Path | str) -> Iterator[Path]:
    """Hold ``out``'s run lock for the duration; refuse at once if another run holds it."""
    out = prepare_out_dir(out)
    path = out / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CheckpointError(f"cannot create the lock file {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunLocked(
                f"{out} is in use by another espn run ({holder(path)}); wait for it to end or "
                "choose another --out"
            ) from None
        try:  # the file may have been removed by its previous holder meanwhile: lock anew
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": now}
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(info) + "\n").encode())
        yield path
    finally:
        path.unlink(missing_ok=True)  # while still held, so no one locks a removed file
        os.close(fd)
