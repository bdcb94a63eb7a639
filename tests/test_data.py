"""Benchmarks: seeded permutations, rotations and subsets; loading raw data, or failing clearly."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import espn
from espn.data import BENCHMARKS, BenchmarkArgs, DatasetUnavailable, load_mnist_like
from espn.data.mnist import ROTATION_ANGLES, rotation_order


def build(name: str, **kw):
    return BENCHMARKS.get(name).build(BenchmarkArgs(**kw))


def first_batch(task, split="train"):
    return next(task.batches(split, 64))


@pytest.mark.parametrize("name", ["permuted-mnist", "rotated-fashion-mnist"])
def test_tasks_deterministic_per_seed(fake_mnist, name):
    a = build(name, n_tasks=4, seed=3, train_per_task=50)
    b = build(name, n_tasks=4, seed=3, train_per_task=50)
    c = build(name, n_tasks=4, seed=4, train_per_task=50)
    for ta, tb in zip(a.tasks, b.tasks, strict=True):
        assert torch.equal(first_batch(ta)[0], first_batch(tb)[0])
        assert torch.equal(ta.train.index, tb.train.index)
    assert any(
        not torch.equal(first_batch(ta)[0], first_batch(tc)[0])
        for ta, tc in zip(a.tasks, c.tasks, strict=True)
    )
    # tasks differ from each other and keep the labels
    xs = [first_batch(t)[0] for t in a.tasks]
    assert not torch.equal(xs[0], xs[1])
    assert xs[0].shape == (50, 1, 28, 28)


def test_permutation_is_a_permutation_of_pixels(fake_mnist):
    seq = build("permuted-mnist", n_tasks=2, seed=0)
    x_raw = seq.tasks[0].train.x[:5]
    permuted = seq.tasks[0].transform(x_raw, False).flatten(1)
    plain = (x_raw.float() / 255 - 0.1307) / 0.3081
    assert torch.equal(permuted.sort(1).values, plain.flatten(1).sort(1).values)
    assert not torch.equal(permuted, plain.flatten(1))


def test_rotations_cover_10_to_360_in_seeded_order():
    order = rotation_order(seed=0, n_tasks=36)
    assert sorted(order) == ROTATION_ANGLES
    assert order != ROTATION_ANGLES
    assert rotation_order(0, 36) == order
    assert rotation_order(1, 36) != order
    assert rotation_order(0, 5) == order[:5]


def test_rotation_by_360_is_identity(fake_mnist):
    seq = build("rotated-mnist", n_tasks=36, seed=0)
    task = next(t for t in seq.tasks if t.name == "rotation 360")
    x_raw = task.test.x[:8]
    plain = ((x_raw.float() / 255 - 0.1307) / 0.3081).unsqueeze(1)
    torch.testing.assert_close(task.transform(x_raw, False), plain, atol=1e-4, rtol=0)


def test_train_subset_is_seeded_and_per_task(fake_mnist):
    seq = build("permuted-mnist", n_tasks=3, seed=0, train_per_task=40, test_per_task=30)
    assert [len(t.train) for t in seq.tasks] == [40, 40, 40]
    assert [len(t.test) for t in seq.tasks] == [30, 30, 30]
    assert not torch.equal(seq.tasks[0].train.index, seq.tasks[1].train.index)
    labels = fake_mnist["train"][1]
    assert torch.equal(seq.tasks[1].train.y, labels[seq.tasks[1].train.index])


def test_batches_cover_every_sample_once(fake_mnist):
    seq = build("permuted-mnist", n_tasks=1, seed=0, train_per_task=150)
    task = seq.tasks[0]
    gen = torch.Generator().manual_seed(0)
    ys = torch.cat([y for _, y in task.batches("train", 64, shuffle=True, generator=gen)])
    assert torch.equal(ys.sort().values, task.train.y.sort().values)
    assert task.num_batches("train", 64) == 3


def _write_idx(path, array: np.ndarray) -> None:
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + b"".join(
        struct.pack(">I", d) for d in array.shape
    )
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_reads_idx_files_in_torchvision_layout(tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = {s: rng.integers(0, 256, (n, 28, 28)) for s, n in (("train", 12), ("t10k", 5))}
    for prefix, arr in images.items():
        _write_idx(raw / f"{prefix}-images-idx3-ubyte.gz", arr)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", np.arange(len(arr)) % 10)
    data = load_mnist_like("fashion-mnist", tmp_path, download=False)
    assert torch.equal(data["train"][0], torch.from_numpy(images["train"].astype(np.uint8)))
    assert torch.equal(data["test"][1], torch.arange(5) % 10)


def test_missing_dataset_says_how_to_get_it(tmp_path):
    with pytest.raises(DatasetUnavailable, match="internet access"):
        load_mnist_like("mnist", tmp_path, download=False)


def test_fashion_mnist_reads_a_directory_of_gzipped_idx_files_as_tensors(tmp_path):
    """``espn.fashion_mnist(root)``: the Debian layout (the four .gz files in ``root``
    itself), as float images in [0, 1] of shape [N, 1, 28, 28] and int64 labels."""
    rng = np.random.default_rng(1)
    images = {s: rng.integers(0, 256, (n, 28, 28)) for s, n in (("train", 7), ("t10k", 3))}
    for prefix, arr in images.items():
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", arr)
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", (np.arange(len(arr)) * 3) % 10)
    x, y = espn.fashion_mnist(tmp_path, train=False)
    assert x.shape == (3, 1, 28, 28) and x.dtype == torch.float32
    expected = torch.from_numpy(images["t10k"].astype(np.float32)).unsqueeze(1) / 255
    assert torch.equal(x, expected)
    assert y.dtype == torch.int64 and y.tolist() == [0, 3, 6]
    x, _ = espn.data.fashion_mnist(str(tmp_path))  # the training split by default
    assert x.shape == (7, 1, 28, 28)


def test_fashion_mnist_without_data_says_how_to_get_it(tmp_path, monkeypatch):
    import espn.data.sources as sources

    monkeypatch.setitem(sources.OFFLINE_DIRS, "fashion-mnist", tmp_path / "no-debian-copy")
    with pytest.raises(DatasetUnavailable) as err:
        espn.data.fashion_mnist(tmp_path)
    assert f"fashion-mnist is not in {tmp_path}" in str(err.value)
    assert "apt-get install dataset-fashion-mnist, or pass download=True" in str(err.value)


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(), reason="Debian's copy not installed"
)
def test_fashion_mnist_finds_debians_offline_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("ESPN_DATA", str(tmp_path))  # nothing there: Debian's copy is used
    x, y = espn.data.fashion_mnist(train=False)
    assert x.shape == (10000, 1, 28, 28) and 0.0 <= float(x.min()) < float(x.max()) <= 1.0
    assert torch.bincount(y).tolist() == [1000] * 10
