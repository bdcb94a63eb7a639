"""Where an export may write: refused up front, before any work, in one line (a directory,
an unknown suffix, no permission, a file of a run directory, an existing file without
``--overwrite``)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from espn.layers import ExportError
from espn.utils.io import os_error_text

FORMATS = {".pt2": "torch.export", ".onnx": "onnx"}


def onnx_available() -> bool:
    """Whether ONNX export can run here (``onnx`` and ``onnxscript`` installed)."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxscript"))


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Within: a file-system error (a read-only place such as /proc, a full disk) becomes one
    :class:`ExportError` naming ``path``."""
    try:
        yield
    except OSError as exc:
        raise ExportError(f"--out {path}: cannot write it ({os_error_text(exc)})") from None


def export_files(out: Path | str, also_onnx: bool | None = None) -> list[Path]:
    """Every file an export to ``out`` writes: ``out``, with a ``.pt2`` the ``.onnx`` beside it
    when ``also_onnx`` (None: when ONNX export is available), and the ``.json`` report."""
    out = Path(out)
    onnx = out.suffix == ".pt2" and (onnx_available() if also_onnx is None else also_onnx)
    return [out, *([out.with_suffix(".onnx")] if onnx else []), out.with_suffix(".json")]


#: what marks a directory as a run directory (its checkpoint manifest, its results)
RUN_MARKS = ("checkpoint/manifest.json", "results.json")


def _run_directory_of(path: Path, runs: list[Path]) -> Path | None:
    """The run directory holding ``path``: one of ``runs``, or a directory above ``path``
    with a checkpoint manifest or results.json; None when none does."""
    for parent in path.parents:
        if parent in runs or any((parent / mark).is_file() for mark in RUN_MARKS):
            return parent
    return None


def _an_export(path: Path) -> bool:
    """Whether the existing ``path`` is what an export writes: a ``.pt2``/``.onnx`` model, or
    a ``.json`` report beside one."""
    if path.suffix in FORMATS:
        return True
    return path.suffix == ".json" and any(path.with_suffix(s).is_file() for s in FORMATS)


def check_not_replacing(files: list[Path], overwrite: bool, run: Path | str | None = None) -> None:
    """Refuse, before any work, to write any of ``files`` (see :func:`export_files`) where it
    would replace a file of a run directory (``run``, or any run directory it lies in): its
    ``checkpoint/``, its results, plots or logs; only an earlier export there may be
    replaced. Without ``overwrite``, refuse to replace any existing file."""
    runs = [Path(run).resolve()] if run is not None else []
    for file in files:
        path = file.resolve()
        owner = _run_directory_of(path, runs)
        if owner is not None and (
            path.is_relative_to(owner / "checkpoint")
            or path.is_dir()
            or (path.exists() and not _an_export(path))
        ):
            raise ExportError(
                f"--out {files[0]} would write {file}, a file of the run directory {owner}; an "
                "export never replaces a run's own files: choose another --out (outside its "
                "checkpoint/, e.g. a new file in an exports/ directory)"
            )
    existing = [str(f) for f in files if f.exists()]
    if existing and not overwrite:
        raise ExportError(
            f"--out {files[0]} would replace {', '.join(existing)}; pass --overwrite to replace "
            f"{'it' if len(existing) == 1 else 'them'}, or choose another --out"
        )


def check_target(out: Path | str) -> Path:
    """Refuse, before any work, an output path that cannot be written: a directory, a path
    under a file, a directory without write permission, or an unknown suffix."""
    out = Path(out)
    if out.is_dir():
        raise ExportError(f"--out {out} is a directory; give a file name ending in .pt2 or .onnx")
    if out.suffix not in FORMATS:
        raise ExportError(
            f"cannot tell the export format from {out.name!r}; "
            f"use a file name ending in {' or '.join(FORMATS)}"
        )
    parent = next((p for p in out.absolute().parents if p.exists()), Path("/"))
    if not parent.is_dir():
        raise ExportError(f"--out {out}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(f"--out {out}: cannot write into {parent} (permission denied)")
    return out
