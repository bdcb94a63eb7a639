"""The experiment knobs of the paper's sample-size, task-order and data-efficiency figures:
per-task training-set sizes, task order policies, and learning on top of a finished run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from espn.api.experiment import build_benchmark, run_experiment
from espn.cli.main import app
from espn.data.order import DESCRIPTOR_SAMPLES, farthest_point_order, task_order
from espn.data.sizes import resolve_train_sizes
from espn.data.tasks import Split, Task, TaskSequence
from espn.evaluation.metrics import task_logits
from espn.runs.checks import option_differences
from espn.runs.config import make_config
from espn.runs.loading import load_run
from helpers.deploy import Killed, comparable, kill_at_step, run_options
from helpers.images import fake_raw, patch_raw

runner = CliRunner()


@pytest.fixture
def tiny(fake_mnist, fc_test_model):
    """Model ``fc-test`` on the fake data."""


def train_sizes_of(seq: TaskSequence) -> list[int]:
    return [len(seq.tasks[t].train) for t in range(len(seq))]


# ------------------------------------------------------------------ --train-sizes
@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ("30,60,90", 3, [30, 60, 90]),
        ("geometric:200:50", 3, [200, 100, 50]),
        ("geometric:1000:10", 5, [1000, 316, 100, 32, 10]),
        ("geometric:80:80", 4, [80, 80, 80, 80]),
        ("geometric:7:1", 1, [7]),
    ],
)
def test_train_size_rules(text, n, expected):
    assert resolve_train_sizes(text, n) == expected


@pytest.mark.parametrize("bench", ["permuted-mnist", "rotated-mnist", "split-fashion-mnist"])
def test_train_sizes_are_honoured_by_every_benchmark(tiny, monkeypatch, bench):
    patch_raw(monkeypatch, {"fashion-mnist": fake_raw(10, 40, 10, shape=(28, 28))})
    cfg = make_config(benchmark=bench, tasks=3, train_sizes="30,5,17", test_per_task=9)
    seq = build_benchmark(cfg)
    assert train_sizes_of(seq) == [30, 5, 17]
    assert [len(seq.tasks[t].test) for t in range(3)] == [9, 9, 9]
    for t in range(3):  # a seeded subset of distinct samples
        assert len(set(seq.tasks[t].train.index.tolist())) == len(seq.tasks[t].train)
    again = build_benchmark(cfg)
    assert all(
        torch.equal(a.train.index, b.train.index)
        for a, b in zip(seq.tasks, again.tasks, strict=True)
    )


def test_train_sizes_override_train_per_task_and_reach_the_results(tiny, tmp_path):
    cfg = make_config(
        **run_options(tmp_path / "run", train_per_task=64, train_sizes="geometric:256:64")
    )
    doc = run_experiment(cfg, progress=False)
    assert doc["train_samples"] == [256, 128, 64]
    assert doc["config"]["train_sizes"] == "geometric:256:64"
    listed = make_config(**run_options(tmp_path / "x", train_sizes=[20, 30, 40]))
    assert listed.train_sizes == "20,30,40" and listed.task_train_sizes() == [20, 30, 40]


def test_train_sizes_of_image_folders(tmp_path):
    gen = torch.Generator().manual_seed(0)
    folders = []
    for t in range(2):
        root = tmp_path / f"task{t}"
        for c in ("a", "b"):
            (root / c).mkdir(parents=True)
            for i in range(12):
                img = torch.randint(0, 256, (8, 8, 3), generator=gen, dtype=torch.uint8)
                Image.fromarray(img.numpy()).save(root / c / f"{i}.png")
        folders.append(root)
    cfg = make_config(
        benchmark="image-folders", folders=tuple(folders), image_size=8, train_sizes="3,11"
    )
    assert train_sizes_of(build_benchmark(cfg)) == [3, 11]


def test_more_than_a_task_has_is_a_warning(tiny, tmp_path):
    cfg = make_config(**run_options(tmp_path / "run", tasks=2, train_sizes="1000,50"))
    notes = []
    doc = run_experiment(cfg, progress=False, on_warning=notes.append)
    assert doc["train_samples"] == [400, 50]
    assert len(notes) == 1 and "train_sizes asks for up to 1000" in notes[0]


# ------------------------------------------------------------------ --task-order
def order_config(policy: str, **kw):
    return make_config(
        benchmark="permuted-mnist", tasks=5, train_sizes="40,90,10,90,60", task_order=policy, **kw
    )


def test_large_first_and_small_first_sort_by_training_set_size(tiny):
    large = build_benchmark(order_config("large-first"))
    small = build_benchmark(order_config("small-first"))
    given = build_benchmark(order_config("given"))
    assert train_sizes_of(large) == [90, 90, 60, 40, 10]
    assert train_sizes_of(small) == [10, 40, 60, 90, 90]
    assert large.info["given_positions"] == [1, 3, 4, 0, 2]  # ties keep the given order
    assert small.info["given_positions"] == [2, 0, 4, 1, 3]
    names = [given.tasks[t].name for t in range(5)]
    assert [large.tasks[t].name for t in range(5)] == [names[i] for i in [1, 3, 4, 0, 2]]
    for t, g in enumerate(large.info["given_positions"]):  # the same task, moved
        assert torch.equal(large.tasks[t].train.index, given.tasks[g].train.index)


def test_random_order_is_drawn_from_the_task_seed(tiny):
    first = build_benchmark(order_config("random", task_seed=3)).info["given_positions"]
    again = build_benchmark(order_config("random", task_seed=3, seed=9)).info["given_positions"]
    assert first == again and sorted(first) == list(range(5))
    others = {
        tuple(build_benchmark(order_config("random", task_seed=s)).info["given_positions"])
        for s in range(4, 10)
    }
    assert len(others | {tuple(first)}) > 2  # other seeds, other orders


def constant_task(name: str, value: float) -> Task:
    x = torch.full((6, 1, 4, 4), value)
    split = Split(x, torch.arange(6), torch.arange(6) % 2)
    return Task(name, split, split, lambda b, train: b, 2)


def test_diverse_order_is_a_farthest_point_traversal():
    # descriptors: (value x 16 means, 16 zero stds); tasks 0 and 1 are near duplicates
    values = [0.0, 0.1, 5.0, 10.0]
    seq = TaskSequence(
        "planted", [constant_task(f"t{v}", v) for v in values], (1, 4, 4), multi_head=True
    )
    # mean 3.775: task 3 is farthest; then 0 (10 from 3), then 2 (5 from both), then 1
    assert task_order(seq, "diverse", seed=0) == [3, 0, 2, 1]


def test_diverse_order_of_a_benchmark_is_deterministic_and_greedy(tiny):
    cfg = order_config("diverse")
    order = build_benchmark(cfg).info["given_positions"]
    assert order == build_benchmark(cfg).info["given_positions"]
    given = build_benchmark(order_config("given"))
    descriptors = []
    for t in range(5):  # computed here independently: mean and std per input position
        task = given.tasks[t]
        x = task.transform(task.train.x[task.train.index[:DESCRIPTOR_SAMPLES]], False)
        x = x.flatten(1).double()
        descriptors.append(torch.cat([x.mean(0), x.std(0, unbiased=False)]))
    d = torch.stack(descriptors)
    assert order[0] == int(torch.linalg.vector_norm(d - d.mean(0), dim=1).argmax())
    for i in range(1, 5):  # every next task is the farthest from those placed before it
        placed = d[order[:i]]
        gap = {
            t: float(torch.cdist(d[t : t + 1], placed).min())
            for t in set(range(5)) - set(order[:i])
        }
        assert gap[order[i]] == pytest.approx(max(gap.values()))
    assert farthest_point_order(d) == order


def test_task_order_reaches_the_results(tiny, tmp_path):
    cfg = make_config(
        **run_options(tmp_path / "run", train_sizes="32,128,64", task_order="small-first")
    )
    doc = run_experiment(cfg, progress=False)
    assert doc["train_samples"] == [32, 64, 128]
    assert doc["task_names"] == ["permutation 0", "permutation 2", "permutation 1"]
    assert doc["config"]["task_order"] == "small-first"


# ------------------------------------------------------------------ --from-run
def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def source_run(tiny, tmp_path) -> Path:
    out = tmp_path / "source"
    run_experiment(make_config(**run_options(out, train_per_task=128)), progress=False)
    return out


def test_from_run_keeps_the_source_byte_identical_and_earlier_tasks_unchanged(source_run, tmp_path):
    before = tree_hashes(source_run)
    out = tmp_path / "new"
    cfg = make_config(
        **run_options(
            out,
            tasks=2,
            task_seed=5,
            train_per_task=32,
            from_run=source_run,
            after_task=2,
        )
    )
    doc = run_experiment(cfg, progress=False)
    assert tree_hashes(source_run) == before  # nothing written, locked or left behind
    source = json.loads((source_run / "results.json").read_text())
    assert doc["task_names"][:2] == source["task_names"][:2]
    assert doc["train_samples"] == [128, 128, 32, 32] and doc["complete"]
    assert doc["accuracy_matrix"][:2] == source["accuracy_matrix"][:2]
    assert max(doc["forgetting"]) == 0.0
    assert doc["config"]["from_run"] == str(source_run.resolve())

    old, new = load_run(source_run), load_run(out)
    assert new.n_tasks == 4
    seq = build_benchmark(new.config)
    for t in range(2):  # the kept tasks' logits, bit for bit
        assert torch.equal(
            task_logits(old.supernet, seq.tasks[t], t), task_logits(new.supernet, seq.tasks[t], t)
        )
    for name, layer in new.supernet.layers.items():  # the source's third task is gone
        kept = old.supernet.owners.ids[name] < 2
        assert torch.equal(new.supernet.owners.ids[name] < 2, kept)
        assert torch.equal(layer.weight[kept], old.supernet.layers[name].weight[kept])
    assert doc["new_weights"][2] > 0  # the new tasks took weights freed from task 3


def test_a_killed_from_run_run_resumes_exactly(source_run, tmp_path, monkeypatch):
    options = {"tasks": 2, "task_seed": 5, "from_run": source_run, "after_task": 1}
    reference = run_experiment(make_config(**run_options(tmp_path / "ref", **options)), False)
    cfg = make_config(**run_options(tmp_path / "new", **options))
    with monkeypatch.context() as mp:
        kill_at_step(mp, 23)  # the second new task, in the middle of its training
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    doc = run_experiment(cfg, progress=False, resume=True)
    assert comparable(doc) == comparable(reference)


def from_run_cli(source: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--benchmark",
        "permuted-mnist",
        "--model",
        "fc-test",
        "--tasks",
        "1",
        "--epochs",
        "1,1,1",
        "--from-run",
        str(source),
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--after-task", "4"], "after_task must be <= the 3 task(s) finished in"),
        (["--after-task", "0"], "after_task must be >= 1"),
        (["--after-task", "1", "--method", "packnet"], "is a run of method 'espn'"),
        (["--after-task", "1", "--model", "fc1024"], "its model is 'fc-test' but this run's"),
        ([], "from_run and after_task go together"),
        (["--after-task", "1", "--out", "SOURCE"], "is this run's own --out"),
    ],
)
def test_bad_from_run_is_refused(source_run, tmp_path, extra, message):
    before = tree_hashes(source_run)
    extra = [str(source_run) if e == "SOURCE" else e for e in extra]
    result = runner.invoke(app, from_run_cli(source_run, tmp_path / "new", *extra))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert tree_hashes(source_run) == before
    assert not (tmp_path / "new" / "results.json").exists()


# ------------------------------------------------------------------ bad values
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--train-sizes", "10,abc,3"], "train_sizes must be comma-separated sizes"),
        (["--train-sizes", "10,0,3"], "every size must be in [1, 2147483647], got 0"),
        (["--train-sizes", "geometric:100"], "or geometric:N1:N2"),
        (["--train-sizes", "100,50"], "train_sizes lists 2 size(s) but the run has 3 task(s)"),
        (["--task-order", "sideways"], "unknown task order 'sideways'; choose one of: given"),
        (["--after-task", "2"], "from_run and after_task go together"),
        (["--from-run", "/nonexistent/run", "--after-task", "1"], "no checkpoint in"),
        (
            ["--method", "mtl", "--from-run", "/x", "--after-task", "1"],
            "learns all its tasks at once",
        ),
    ],
)
def test_bad_knob_values_are_refused(tmp_path, args, message):
    result = runner.invoke(
        app,
        [
            "run",
            "--benchmark",
            "permuted-mnist",
            "--tasks",
            "3",
            "--out",
            str(tmp_path / "r"),
            *args,
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "r").exists()


def test_a_run_saved_before_the_knobs_existed_resumes_with_their_defaults(tiny, tmp_path):
    cfg = make_config(**run_options(tmp_path / "run"))
    saved = cfg.model_dump(mode="json")
    for key in ("train_sizes", "task_order", "from_run", "after_task"):
        del saved[key]
    assert option_differences(saved, cfg) == []
    changed = make_config(**run_options(tmp_path / "run", task_order="random"))
    assert option_differences(saved, changed) == [
        "task_order='given' in the checkpoint, 'random' now"
    ]


@pytest.mark.parametrize("method", ["packnet", "individual", "supsup", "cpg", "rmn"])
def test_every_sequential_method_learns_on_top_of_a_run(tiny, tmp_path, method):
    source = tmp_path / "source"
    small = {"method": method, "tasks": 2, "train_per_task": 64, "epochs": (1, 1, 1)}
    # so short a run: CPG's and RMN's own rules would give task 0 the whole network
    small |= {"cpg": {"cpg_train_acc": 0.0}, "rmn": {"rmn_budget": 0.3}}.get(method, {})
    run_experiment(make_config(**run_options(source, **small)), progress=False)
    out = tmp_path / "new"
    doc = run_experiment(
        make_config(
            **run_options(out, **small | {"tasks": 1}), task_seed=3, from_run=source, after_task=1
        ),
        progress=False,
    )
    assert doc["complete"] and len(doc["accuracy_matrix"]) == 2
    old, new = load_run(source), load_run(out)
    task = build_benchmark(new.config).tasks[0]
    assert torch.equal(task_logits(old.supernet, task, 0), task_logits(new.supernet, task, 0))
