"""Raw datasets: torchvision loaders (download for users online) and offline copies."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from espn.errors import EspnError

OFFLINE_DIRS = {"fashion-mnist": Path("/usr/share/datasets/fashion-mnist")}
HOW_TO_GET = {
    "mnist": "run with internet access once (torchvision downloads it into --data-dir)",
    "fashion-mnist": "run with internet access once, or on Debian: apt-get install dataset-fashion-mnist",
}


class DatasetUnavailable(EspnError, RuntimeError):
    """A dataset is neither on disk nor downloadable; the message says how to get it."""


def unavailable(
    name: str, root: Path | str, download: bool, exc: Exception | None, how: str
) -> DatasetUnavailable:
    """The one-line error for dataset ``name`` missing from ``root`` (where it was looked
    for): it could not be downloaded (``exc``, its first line), or ``download`` was off (a run
    directory's recorded data directory is only read; the Python loaders' default)."""
    if not download:
        return DatasetUnavailable(
            f"{name} is not in {root}, and espn downloads nothing here (a run directory's data "
            f"directory is only read): pass --data-dir pointing at a directory that holds it "
            f"(torchvision's layout); to get it: {how}, or pass download=True"
        )
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return DatasetUnavailable(
        f"{name} is not in {root} and could not be downloaded ({reason}); to get it: {how}"
    )


def default_data_dir() -> Path:
    """Where downloads go: ``$ESPN_DATA`` or ``~/.cache/espn/data``."""
    return Path(os.environ.get("ESPN_DATA", Path.home() / ".cache" / "espn" / "data"))


def _read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _offline_mnist_like(directory: Path) -> dict[str, tuple[Tensor, Tensor]] | None:
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        found = []
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            candidates = [directory / f"{prefix}-{kind}{ext}" for ext in (".gz", "")]
            path = next((p for p in candidates if p.exists()), None)
            if path is None:
                return None
            found.append(torch.from_numpy(_read_idx(path).copy()))
        out[split] = (found[0], found[1].long())
    return out


def load_mnist_like(
    name: str, root: Path | None = None, download: bool = True
) -> dict[str, tuple[Tensor, Tensor]]:
    """``{"train": (images uint8 [N, 28, 28], labels), "test": ...}`` for MNIST or Fashion-MNIST,
    from ``root`` (the IDX files, or torchvision's ``root/<Class>/raw``), Debian's offline
    copy, or else downloaded through torchvision when ``download`` is set."""
    root = Path(root) if root is not None else default_data_dir()
    class_name = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}[name]  # torchvision's
    offline = OFFLINE_DIRS.get(name)
    raw_dir = root / class_name / "raw"
    for directory in (root, raw_dir, offline):
        if directory is not None and directory.is_dir():
            found = _offline_mnist_like(directory)
            if found is not None:
                return found
    if not download:
        where = f"{root} (nor in {raw_dir}" + (f" or {offline}" if offline else "") + ")"
        raise unavailable(name, where, download, None, HOW_TO_GET[name])
    splits = torchvision_splits(name, class_name, root, download, HOW_TO_GET[name])
    return {s: (d.data.clone(), d.targets.clone().long()) for s, d in splits.items()}


def torchvision_splits(
    name: str, class_name: str, root: Path, download: bool, how: str
) -> dict[str, Any]:
    """The train and test datasets of torchvision's ``class_name`` in ``root`` (downloaded
    there when ``download``); missing ones raise :func:`unavailable` saying ``how`` to get it."""
    from torchvision import datasets  # importing torchvision costs seconds: only when needed

    cls = getattr(datasets, class_name)
    try:
        return {s: cls(str(root), train=s == "train", download=download) for s in ("train", "test")}
    except Exception as exc:  # RuntimeError when missing, URLError/OSError offline
        raise unavailable(name, root, download, exc, how) from exc
