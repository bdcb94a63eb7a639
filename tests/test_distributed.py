"""Data-parallel training of one run (``espn.training.distributed``): the shards, the
gradient and BatchNorm arithmetic over ranks, and real 2-rank runs under ``torchrun`` (gloo)
compared with one process."""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file

import espn
from espn.data.tasks import Split, Task
from espn.layers.batchnorm2d import TaskBatchNorm2d
from espn.training import distributed
from espn.training.distributed import DistributedError, Ranks

HELPER = Path(__file__).parent / "helpers" / "ddp_run.py"
SRC = Path(distributed.__file__).parents[2]
#: optimizer steps before the kill: the helper's first task takes 176 (44 per epoch of its
#: 4), so this is in the second task's prune phase, after its pre-training was checkpointed
KILL_AT = 240


def _norm_net() -> tuple[torch.nn.Module, TaskBatchNorm2d]:
    """A convolution, a task BatchNorm (cumulative statistics) and a linear head."""
    torch.manual_seed(0)
    norm = TaskBatchNorm2d(4, "g")
    norm.momentum = None
    net = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1), norm, torch.nn.Flatten(), torch.nn.Linear(100, 3)
    )
    return net, norm


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 7, 12])
def test_a_sharded_step_sums_its_slices(count: int, n: int) -> None:
    """The slices cover the batch in order, each trained alone (its BatchNorm over the slice);
    the gradients and loss are the slices' weighted by their shares, the running statistics
    the whole batch's; a batch of fewer samples than slices is trained whole."""
    net, norm = _norm_net()
    plain = copy.deepcopy(net)
    plain[1] = torch.nn.BatchNorm2d(4)  # torch's, over each slice
    plain[1].load_state_dict(norm.state_dict(), strict=False)
    x, y = torch.randn(n, 2, 5, 5), torch.arange(n) % 3
    seen = []

    def backward(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        seen.append(ys)
        loss = F.cross_entropy(net(xs), ys)
        loss.backward()
        return loss

    params = list(net.parameters())
    loss = distributed.sharded_step(None, count, x, y, backward, params)
    assert torch.equal(torch.cat(seen), y) and len(seen) == (1 if n < count else count)
    want_loss = torch.tensor(0.0)
    want = [torch.zeros_like(p) for p in params]
    for ys, xs in zip(seen, x.split([len(s) for s in seen]), strict=True):
        plain.zero_grad()
        part = F.cross_entropy(plain(xs), ys)
        part.backward()
        want_loss += part.detach() * len(ys) / n
        for w, p in zip(want, plain.parameters(), strict=True):
            w += p.grad * len(ys) / n
    torch.testing.assert_close(loss, want_loss)
    for p, w in zip(params, want, strict=True):
        torch.testing.assert_close(p.grad, w)
    inputs = net[0](x).detach()
    torch.testing.assert_close(norm.running_mean, inputs.mean((0, 2, 3)))
    if n > 1:
        torch.testing.assert_close(norm.running_var, inputs.var((0, 2, 3)))
    assert int(norm.num_batches_tracked) == 1


def test_no_process_group_without_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.join(True, "cpu") is None
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.join(False, "cpu") is None  # the explicit switch refuses it
    with pytest.raises(DistributedError, match="--device cuda"):
        distributed.join(True, "cuda:0")  # one GPU for every rank: refused before joining


@pytest.fixture
def alone() -> Any:
    """A process group of this process alone (gloo, world size 1)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield Ranks(0, 1, "cpu")
    dist.destroy_process_group()


def test_a_group_of_one_computes_what_one_process_computes(alone: Ranks) -> None:
    """The slices gathered over a process group (of one rank here) are summed as one
    process sums them: gradients, loss and statistics bit for bit."""
    results = []
    for ranks in (None, alone):
        net, norm = _norm_net()
        x, y = torch.randn(9, 2, 5, 5), torch.arange(9) % 3

        def backward(xs: torch.Tensor, ys: torch.Tensor, net: Any = net) -> torch.Tensor:
            loss = F.cross_entropy(net(xs), ys)
            loss.backward()
            return loss

        loss = distributed.sharded_step(ranks, 3, x, y, backward, list(net.parameters()))
        results.append([loss, *(p.grad for p in net.parameters()), *norm.state_dict().values()])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_recalibration_in_slices_is_the_plain_one(alone: Ranks) -> None:
    """Task BatchNorm statistics recalibrated as a sliced run does (the batches' statistics
    averaged in batch order) are the plain recalibration's, and a process group's (of one
    rank here) are one process's, bit for bit."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(144, 3),
    )
    sn = espn.wrap(net, torch.zeros(2, 1, 8, 8))
    sn.begin_task(3)
    x, y = torch.randn(23, 1, 8, 8) * 3 + 1, torch.arange(23) % 3
    split = Split(x, torch.arange(23), y)
    task = Task("t", split, split, lambda batch, train: batch, 3)
    states = []
    norms = [m for m in sn.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for ranks, count in ((None, 1), (None, 2), (alone, 2)):
        for m in norms:  # stale statistics, which the recalibration replaces
            m.running_mean.fill_(7.0)
        assert distributed.recalibrate(ranks, count, sn, task, 5) == 5
        assert norms and all((m.running_mean != 7.0).all() for m in norms)
        states.append(
            {k: v.clone() for k, v in sn.state_dict().items() if "running" in k or "tracked" in k}
        )
    plain, sliced, grouped = states
    assert plain and plain.keys() == sliced.keys() == grouped.keys()
    for key in plain:
        torch.testing.assert_close(sliced[key], plain[key])
        assert torch.equal(grouped[key], sliced[key])


#: a process joining a group of one (as torchrun describes it), building an optimizer (which
#: imports ``torch._dynamo``, and with it ``torch.distributed.nn``), then exiting; a handler
#: registered before the join runs after espn's and prints the threads left
LEAVER = """
import atexit, os, sys, torch
from espn.training.distributed import join
def threads(): return sorted({open(f"/proc/self/task/{t}/comm").read().strip()
                              for t in os.listdir("/proc/self/task")})
atexit.register(lambda: print("left", threads()))
join(True, "cpu")
torch.distributed.barrier()  # the group at work: its gloo threads exist however loaded the machine
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
print("joined", threads())
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_the_group_and_its_threads_end_before_the_interpreter() -> None:
    """The process group is destroyed at exit while the interpreter is whole: no gloo thread
    is left for its teardown (where one aborted ranks at random)."""
    env = _env() | {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    done = subprocess.run(
        [sys.executable, "-c", LEAVER], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    joined, left = done.stdout.splitlines()
    assert "gloo" in joined and left.startswith("left") and "gloo" not in left


def test_fewer_slices_than_ranks_are_refused() -> None:
    assert distributed.shard_count(None, None) == 1
    assert distributed.shard_count(None, Ranks(0, 2, "cpu")) == 2
    assert distributed.shard_count(4, Ranks(1, 2, "cpu")) == 4
    with pytest.raises(DistributedError, match="shards 1 is fewer than the 2 processes"):
        distributed.shard_count(1, Ranks(0, 2, "cpu"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    """This worktree's espn on one thread, no torchrun variables of this process."""
    env = os.environ | {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


#: a rank torchrun reports failed, and its exit status
FAILED_RANK = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s+exitcode\s*:\s*(-?\d+)")


def _statuses(done: subprocess.CompletedProcess[str], world: int) -> list[int]:
    """The exit status of every rank: a process alone its own; under torchrun the one its
    report of failures gives the rank, 0 for a rank it does not name."""
    if world == 1:
        return [done.returncode]
    statuses = [0] * world
    for rank, status in FAILED_RANK.findall(done.stderr):
        statuses[int(rank)] = int(status)
    assert done.returncode == 0 or any(statuses), done.stderr[-2000:]
    return statuses


def _run(method: str, out: Path, report: Path, ranks: int, *extra: str) -> list[int]:
    """The helper's run, alone (``ranks`` 1) or under torchrun with ``ranks`` processes: the
    exit status of every rank."""
    env = _env()
    args = [str(HELPER), method, str(out), str(report), *extra]
    if ranks > 1:
        launcher = ["-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
        args = [*launcher, f"--master-port={_free_port()}", *args]
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
    return _statuses(done, ranks)


def _report(report: Path, rank: int = 0) -> dict[str, Any]:
    return json.loads((report / f"rank-{rank}.json").read_text())


def frozen_kept(states: list[dict[str, Any]]) -> bool:
    """Whether every weight a task owned is bit-identical after every later task."""
    for t, state in enumerate(states[:-1]):
        for later in states[t + 1 :]:
            for name, owners in state["owners"].items():
                ids = torch.tensor(owners).flatten()
                mine = (ids <= t).nonzero().flatten().tolist()
                before, after = state["weights"][name], later["weights"][name]
                if any(before[i] != after[i] for i in mine):
                    return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("method", ["espn", "packnet", "supsup", "cpg", "rmn", "individual", "mtl"])
def test_two_ranks_train_the_run_of_one_process(method: str, tmp_path: Path) -> None:
    """2 gloo ranks train what 1 process trains in the same 2 slices of each batch, bit for
    bit (owner ids, masks, weights, statistics, accuracies); frozen weights kept; rank 0's
    results.json."""
    assert _run(method, tmp_path / "one", tmp_path / "r1", 1, "--shards", "2") == [0]
    assert _run(method, tmp_path / "two", tmp_path / "r2", 2) == [0, 0]
    one, two, other = (
        _report(tmp_path / "r1"),
        _report(tmp_path / "r2"),
        _report(tmp_path / "r2", 1),
    )
    assert two["world"] == 2 and other["rank"] == 1
    assert one["digest"] == two["digest"] == other["digest"]
    assert one["states"] == two["states"] == other["states"]
    assert one["accuracy"] == two["accuracy"]
    assert frozen_kept(two["states"])
    saved = json.loads((tmp_path / "two" / "results.json").read_text())
    assert saved["accuracy_matrix"] == two["accuracy"]


@pytest.mark.slow
def test_killed_run_resumes_at_any_world_size(tmp_path: Path) -> None:
    """Killed in its second task, a 2-rank run resumes with 2 ranks or with 1 process, and a
    killed 1-process run with 2 ranks, each to the uninterrupted 2-rank run's end, bit for
    bit (every run in 2 slices of each batch)."""
    shards = ["--tasks", "2", "--shards", "2"]
    assert _run("espn", tmp_path / "whole", tmp_path / "rw", 2, *shards) == [0, 0]
    whole = _report(tmp_path / "rw")
    assert frozen_kept(whole["states"])
    for killed, world in ((2, 2), (2, 1), (1, 2)):
        out, report = tmp_path / f"{killed}-to-{world}", tmp_path / f"r{killed}{world}"
        kill = ["--stop-after-steps", str(KILL_AT)]
        statuses = _run("espn", out, tmp_path / f"k{killed}{world}", killed, *shards, *kill)
        # the kill, or torchrun ending the other rank after it
        assert 17 in statuses and set(statuses) <= {17, -15}
        manifest = json.loads((out / "checkpoint" / "manifest.json").read_text())
        assert len(manifest["tasks"]) == 1  # the first task done, the second in training
        assert _run("espn", out, report, world, *shards) == [0] * world
        resumed = _report(report)
        assert resumed["world"] == world
        assert json.loads((out / "results.json").read_text())["complete"]
        assert resumed["digest"] == whole["digest"]
        assert resumed["states"][-1] == whole["states"][-1]
        assert resumed["accuracy"] == whole["accuracy"]


FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.slow
@pytest.mark.skipif(not FASHION.is_dir(), reason="needs Fashion-MNIST in /usr/share/datasets")
@pytest.mark.parametrize("step", [[], ["--amp"], ["--compile"]], ids=["eager", "amp", "compile"])
def test_espn_run_under_torchrun_reports_once_and_matches_one_process(
    step: list[str], tmp_path: Path
) -> None:
    """``torchrun -m espn run`` on real data: rank 0 alone reports and writes; the results
    and every task's tensors are those of one process with ``--shards 2`` (FC1024 on 2
    permuted Fashion-MNIST tasks), eager, mixed precision and compiled alike."""
    options = [
        *("-m", "espn", "run", "--benchmark", "permuted-fashion-mnist"),
        *("--data-dir", str(FASHION.parent), "--tasks", "2", "--train-per-task", "512"),
        *("--test-per-task", "256", "--epochs", "1,1,1", "--no-step-floor"),
        *("--batch-size", "64", "--shards", "2", "--no-progress", *step),
    ]
    env = _env()
    launcher = [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        f"--master-port={_free_port()}",
    ]
    docs = []
    for prefix, out in (([], tmp_path / "one"), (launcher, tmp_path / "two")):
        command = [sys.executable, *prefix, *options, "--out", str(out)]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        assert _statuses(done, 2 if prefix else 1) == [0] * (2 if prefix else 1)
        assert done.stdout.count("average accuracy") == 1
        docs.append(json.loads((out / "results.json").read_text()))
    one, two = docs
    assert two["new_weights"] == one["new_weights"]
    assert two["accuracy_matrix"] == one["accuracy_matrix"]
    for task in range(2):
        name = f"checkpoint/task-{task:04d}.safetensors"
        alone, ranks = (load_file(tmp_path / run / name) for run in ("one", "two"))
        assert alone.keys() == ranks.keys()
        assert all(torch.equal(alone[k], ranks[k]) for k in alone), name


@pytest.mark.slow
def test_throughput_benchmark_trains_at_both_world_sizes() -> None:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "distributed_throughput.py"
    env = _env()
    args = ["--model", "fc1024", "--batch", "16", "--steps", "2"]
    done = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and not FAILED_RANK.findall(done.stderr), done.stderr[-2000:]
    table, parts = done.stdout.split("\n\n")
    rows = [line.split() for line in table.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [r[0] for r in rows] == ["1", "2"] and all(r[2] == "6" for r in rows)
    ranks = [line.split()[:2] for line in parts.splitlines()[2:]]  # every rank's parts
    assert ranks == [["1", "0"], ["2", "0"], ["2", "1"]]
