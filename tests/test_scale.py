"""Long task sequences: per-task state is built lazily, so memory does not grow with the tasks
a benchmark could have, and a 300-task run goes to the end with every budget met."""

from __future__ import annotations

import gc

import pytest
import torch

from espn.api.experiment import build_benchmark, run_experiment
from espn.data.tasks import LazyTasks, Split, Task
from espn.runs.config import make_config
from helpers.deploy import run_options


def live_tasks() -> int:
    gc.collect()
    return sum(type(o) is Task for o in gc.get_objects())


def test_lazy_tasks_build_on_use_and_keep_only_the_latest():
    built = []

    def build(t: int) -> Task:
        built.append(t)
        split = Split(torch.zeros(1), torch.arange(1), torch.zeros(1, dtype=torch.long))
        return Task(f"task {t}", split, split, lambda x, train: x, 2)

    tasks = LazyTasks(10, build, keep=2)
    assert len(tasks) == 10 and built == []
    assert tasks[3].name == "task 3" and tasks[-1].name == "task 9"
    assert tasks[3] is tasks[3] and built == [3, 9]  # cached
    assert [t.name for t in tasks[1:3]] == ["task 1", "task 2"]
    assert len(tasks._cache) == 2
    tasks[0]
    assert built.count(3) == 1 and tasks[3].name == "task 3" and built.count(3) == 2  # evicted
    assert tasks.name(9) == "task 9" and built.count(9) == 1  # a name needs no rebuild
    assert [t.name for t in tasks] == [f"task {t}" for t in range(10)]
    with pytest.raises(IndexError):
        tasks[10]


def test_permuted_tasks_are_the_sequential_draws_and_few_are_held(fake_mnist):
    before = live_tasks()
    seq = build_benchmark(make_config(benchmark="permuted-mnist", tasks=1000))
    gen = torch.Generator().manual_seed(0)
    first = [torch.randperm(784, generator=gen) for _ in range(3)]
    x = fake_mnist["test"][0][:5]
    for t in range(3):  # the same permutations as drawn one after another before
        expected = seq.tasks[t].transform(x, False).flatten(1)
        plain = seq.tasks[t].transform.func(x, False, torch.arange(784), "mnist").flatten(1)
        assert torch.equal(expected, plain[:, first[t]])
    for task in seq.tasks:
        assert task.n_classes == 10
    assert live_tasks() - before <= 4
    assert seq.tasks[0].train.index is seq.tasks[999].train.index  # all images: one index


def _long_run(tmp_path, monkeypatch, n_tasks: int) -> tuple[dict, list[int]]:
    cfg = make_config(
        **run_options(
            tmp_path / "run",
            tasks=n_tasks,
            epochs=(0, 1, 0),
            train_per_task=32,
            test_per_task=16,
            batch_size=32,
            alpha=0.01,
        )
    )
    held, before = [], live_tasks()  # other tests' tasks may still be alive

    def on_task_end(line: str) -> None:
        if int(line.split()[1].split("/")[0]) % 10 == 0:
            held.append(live_tasks() - before)

    doc = run_experiment(cfg, progress=False, on_task_end=on_task_end)
    return doc, held


def _check_long_run(doc: dict, held: list[int], n_tasks: int) -> None:
    assert doc["complete"] and len(doc["task_names"]) == n_tasks
    assert max(held) <= 6  # the few most recent tasks, however many were learned
    assert all(r <= 0.2 + 1e-12 for r in doc["flops_ratio"])
    assert all(n <= b for n, b in zip(doc["new_weights"], doc["weight_budget"], strict=True))
    matrix = doc["accuracy_matrix"]
    assert all(doc["final_accuracy"][j] == matrix[j][j] for j in range(n_tasks))


def test_a_long_sequence_holds_only_a_few_tasks(tmp_path, monkeypatch, fake_mnist, fc_test_model):
    # 10 tasks (every task evaluated after each: 55 evaluations), counted after the tenth: a
    # run that held every task would hold 10, above the bound of 6
    doc, held = _long_run(tmp_path, monkeypatch, 10)
    assert len(held) == 1
    _check_long_run(doc, held, 10)


@pytest.mark.slow
def test_300_tiny_tasks_run_to_the_end(tmp_path, monkeypatch, fake_mnist, fc_test_model):
    doc, held = _long_run(tmp_path, monkeypatch, 300)
    _check_long_run(doc, held, 300)
