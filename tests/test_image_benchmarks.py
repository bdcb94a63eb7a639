"""Image benchmarks on fake data: class splits and relabelling, augmentation, ImageFolder task
sequences (held in memory or streamed), and a clear error when data is missing."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from espn.api.experiment import run_experiment
from espn.cli.main import app
from espn.data import BENCHMARKS, BenchmarkArgs, DatasetUnavailable
from espn.data.augment import ImageTransform, normalise, random_crop, random_flip
from espn.data.cifar import STATS, class_order, load_cifar
from espn.data.folders import StreamingTask, image_folders
from espn.runs.config import make_config
from helpers.images import fake_raw, patch_raw

runner = CliRunner()


def build(name: str, **kw):
    return BENCHMARKS.get(name).build(BenchmarkArgs(**kw))


@pytest.fixture
def fake_cifar100(monkeypatch):
    """CIFAR-100's real counts (500 train / 100 test images per class) at 3x8x8."""
    data = fake_raw(100, 500, 100, shape=(3, 8, 8))
    calls = patch_raw(monkeypatch, {"cifar100": data})
    return data, calls


def test_split_cifar100_deals_seeded_disjoint_classes(fake_cifar100):
    data, calls = fake_cifar100
    seq = build("split-cifar100", seed=3)
    assert calls == [("cifar100", None, True)]
    assert len(seq) == 20 and seq.multi_head and seq.n_classes == 5
    order = class_order(100, 3)
    assert sorted(order) == list(range(100)) and order != list(range(100))
    assert seq.info["class_order"] == order
    seen = set()
    for t, task in enumerate(seq.tasks):
        classes = order[5 * t : 5 * t + 5]
        assert task.n_classes == 5 and task.name == "classes " + ",".join(map(str, classes))
        assert (len(task.train), len(task.test)) == (2500, 500)
        for split, (_, raw_y) in (("train", data["train"]), ("test", data["test"])):
            s = task.split(split)
            # labels are 0..4 and map back to the raw classes of the task, in the task's order
            assert set(s.y.tolist()) == set(range(5))
            assert torch.equal(torch.tensor(classes)[s.y], raw_y[s.index])
            assert s.x is seq.tasks[0].split(split).x  # images stored once for all tasks
        seen |= set(classes)
    assert seen == set(range(100))
    assert build("split-cifar100", seed=3).info["class_order"] == order
    assert build("split-cifar100", seed=4).info["class_order"] != order


def test_split_subsets_are_seeded_per_task(fake_cifar100):
    seq = build("split-cifar100", n_tasks=3, seed=0, train_per_task=250, test_per_task=50)
    assert [(len(t.train), len(t.test)) for t in seq.tasks] == [(250, 50)] * 3
    again = build("split-cifar100", n_tasks=3, seed=0, train_per_task=250, test_per_task=50)
    pairs = zip(seq.tasks, again.tasks, strict=True)
    assert all(torch.equal(a.train.index, b.train.index) for a, b in pairs)
    assert not torch.equal(seq.tasks[0].train.index[:50], seq.tasks[1].train.index[:50])


def test_split_cifar10_cifar10_and_split_fashion_mnist(monkeypatch):
    cifar = fake_raw(10, 20, 5)
    fashion = fake_raw(10, 20, 5, shape=(28, 28))
    patch_raw(monkeypatch, {"cifar10": cifar, "fashion-mnist": fashion})
    split = build("split-cifar10", seed=0)
    assert [t.n_classes for t in split.tasks] == [2] * 5 and split.input_shape == (3, 32, 32)
    one = build("cifar10", seed=0)
    assert len(one) == 1 and one.tasks[0].n_classes == 10
    assert torch.equal(one.tasks[0].train.y, cifar["train"][1])  # natural order, no remapping
    fm = build("split-fashion-mnist", seed=0)
    assert len(fm) == 5 and fm.input_shape == (1, 28, 28)
    x, y = next(fm.tasks[0].batches("train", 16))
    assert x.shape == (16, 1, 28, 28) and x.dtype == torch.float32 and set(y.tolist()) <= {0, 1}
    # Fashion-MNIST is not augmented: training and test transforms agree
    raw = fm.tasks[0].train.x[:4]
    assert torch.equal(fm.tasks[0].transform(raw, True), fm.tasks[0].transform(raw, False))
    for name, limit in (("split-cifar10", 5), ("cifar10", 1), ("split-fashion-mnist", 5)):
        assert BENCHMARKS.get(name).max_tasks == limit


def test_random_crop_is_a_window_of_the_padded_image():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 3, 10, 12), generator=gen, dtype=torch.uint8)
    out = random_crop(x, 4, torch.Generator().manual_seed(1))
    assert out.shape == x.shape and out.dtype == torch.uint8
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    offsets = set()
    for i in range(len(x)):  # a slow per-image reference: some window must match exactly
        windows = [
            (dy, dx)
            for dy in range(9)
            for dx in range(9)
            if torch.equal(padded[i, :, dy : dy + 10, dx : dx + 12], out[i])
        ]
        assert windows, f"image {i} is no crop of its padded self"
        offsets.add(windows[0])
    assert len(offsets) > 20  # offsets differ from image to image
    assert torch.equal(random_crop(x, 4, torch.Generator().manual_seed(1)), out)
    assert not torch.equal(random_crop(x, 4, torch.Generator().manual_seed(2)), out)


def test_random_flip_mirrors_about_half_the_images():
    x = torch.randint(0, 256, (400, 1, 5, 7), dtype=torch.uint8)
    out = random_flip(x, torch.Generator().manual_seed(0))
    same = (out == x).flatten(1).all(1)
    mirrored = (out == x.flip(-1)).flatten(1).all(1)
    assert bool((same | mirrored).all())
    assert 150 < int(mirrored.sum()) < 250


def test_image_transform_normalises_and_augments_only_training_batches():
    mean, std = STATS["cifar100"]
    transform = ImageTransform(mean, std, crop_padding=4, flip=True)
    x = torch.randint(0, 256, (32, 3, 32, 32), dtype=torch.uint8)
    expected = (x.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1
    )
    torch.testing.assert_close(transform(x, False), expected)
    torch.testing.assert_close(normalise(x, torch.tensor(mean), torch.tensor(std)), expected)
    torch.manual_seed(5)
    a = transform(x, True)
    torch.manual_seed(5)
    b = transform(x, True)
    assert torch.equal(a, b) and a.shape == (32, 3, 32, 32) and a.dtype == torch.float32
    assert not torch.equal(a, expected)


def test_missing_cifar_offline_raises_dataset_unavailable(tmp_path):
    with pytest.raises(DatasetUnavailable) as err:
        load_cifar("cifar100", tmp_path, download=False)
    message = str(err.value)
    assert "cifar100" in message and str(tmp_path) in message and "internet" in message


def test_missing_data_is_a_clear_cli_error(tmp_path, monkeypatch):
    """The CLI turns DatasetUnavailable into one line and exit status 2 (no download here)."""

    def offline(source, root, download):
        return load_cifar(source, root, download=False)

    monkeypatch.setattr("espn.data.cifar.load_raw", offline)
    result = runner.invoke(
        app,
        [
            "run",
            "--benchmark",
            "split-cifar10",
            "--data-dir",
            str(tmp_path),
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2
    assert "cifar10 is not in" in " ".join(result.output.split())


# ------------------------------------------------------------------ image folders
def write_folder(root, classes: list[str], n: int, size: tuple[int, int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            img = torch.randint(0, 256, (*size, 3), generator=gen, dtype=torch.uint8)
            Image.fromarray(img.numpy()).save(root / c / f"{i}.png")


@pytest.fixture
def folders(tmp_path):
    """Two tasks: one with train/ and val/ subdirectories, one with class directories only."""
    a, b = tmp_path / "birds", tmp_path / "cars"
    write_folder(a / "train", ["crow", "duck", "owl"], 6, (20, 14), 0)
    write_folder(a / "val", ["crow", "duck", "owl"], 2, (12, 18), 1)
    write_folder(b, ["bus", "van"], 10, (16, 16), 2)
    return [a, b]


def test_image_folders_in_memory_and_streamed_agree(folders):
    args = BenchmarkArgs(folders=tuple(folders), image_size=12, seed=0)
    held = image_folders(args, in_memory=True)
    streamed = image_folders(args, in_memory=False, n_workers=0)
    assert held.input_shape == (3, 12, 12) and held.multi_head
    assert [t.name for t in held.tasks] == ["birds", "cars"]
    assert [t.n_classes for t in held.tasks] == [3, 2]
    assert [(len(t.train), len(t.test)) for t in held.tasks] == [(18, 6), (16, 4)]
    assert held.tasks[0].train.x.dtype == torch.uint8
    assert held.tasks[0].train.x.shape == (18, 3, 12, 12)
    assert all(isinstance(t, StreamingTask) for t in streamed.tasks)
    for a, b in zip(held.tasks, streamed.tasks, strict=True):
        for split in ("train", "test"):
            assert torch.equal(a.split(split).y, b.split(split).y)
            ga, gb = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
            torch.manual_seed(0)
            xa = list(a.batches(split, 5, shuffle=True, generator=ga))
            torch.manual_seed(0)
            xb = list(b.batches(split, 5, shuffle=True, generator=gb))
            assert len(xa) == len(xb) == a.num_batches(split, 5)
            for (x1, y1), (x2, y2) in zip(xa, xb, strict=True):
                assert torch.equal(x1, x2) and torch.equal(y1, y2)
    s, h = streamed.tasks[0].train, held.tasks[0].train
    assert torch.equal(s.x[s.index[:4]], h.x[h.index[:4]])  # a streamed split's images by index
    # the held-out split of a flat folder is seeded: a fifth of every class
    cars = held.tasks[1]
    assert sorted(cars.test.y.tolist()) == [0, 0, 1, 1]
    again = image_folders(args, in_memory=True).tasks[1]
    assert torch.equal(again.test.x, cars.test.x)


def test_image_folders_errors(tmp_path, folders):
    with pytest.raises(DatasetUnavailable, match="does not exist"):
        image_folders(BenchmarkArgs(folders=(tmp_path / "nope",)), in_memory=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetUnavailable, match="is not an ImageFolder directory"):
        image_folders(BenchmarkArgs(folders=(tmp_path / "empty",)), in_memory=True)
    with pytest.raises(Exception, match="needs its task directories"):
        make_config(benchmark="image-folders")
    with pytest.raises(Exception, match="tasks must be <= the 2 folders given"):
        make_config(benchmark="image-folders", folders=folders, tasks=3)
    assert make_config(benchmark="image-folders", folders=folders).tasks == 2


def test_image_folders_run_end_to_end(folders, tmp_path, small_resnet_model):
    result = runner.invoke(
        app,
        [
            "run",
            "--benchmark",
            "image-folders",
            "--folders",
            ",".join(map(str, folders)),
            "--image-size",
            "16",
            "--model",
            "small-resnet",
            "--epochs",
            "1,1,1",
            "--batch-size",
            "8",
            "--gamma",
            "0.5",
            "--out",
            str(tmp_path / "run"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["task_names"] == ["birds", "cars"] and doc["complete"]
    assert doc["config"]["folders"] == [str(f) for f in folders]
    assert all(r <= 0.5 for r in doc["flops_ratio"])


def test_split_cifar10_run_writes_results(monkeypatch, tmp_path, small_resnet_model):
    patch_raw(monkeypatch, {"cifar10": fake_raw(10, 16, 8, shape=(3, 16, 16))})
    cfg = make_config(
        benchmark="split-cifar10",
        model="small-resnet",
        tasks=2,
        epochs=(1, 1, 1),
        batch_size=16,
        out=tmp_path / "run",
    )
    doc = run_experiment(cfg, progress=False)
    assert doc["complete"] and len(doc["accuracy_matrix"]) == 2
    assert doc["config"]["betas"] == [0.0, 0.999] and doc["config"]["lr"] == 0.01
    assert all(r <= 0.2 + 1e-12 for r in doc["flops_ratio"])
