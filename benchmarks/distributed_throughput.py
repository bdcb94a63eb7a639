"""Throughput of one task trained by 1 process and by N data-parallel processes (gloo).

Each world size trains the same task with the same global batch: synthetic CIFAR-sized
images (crop+flip) on ``--model`` (default the reduced ResNet-18), ``--method``'s whole task
(its phases, prune events, BatchNorm recalibration and commit), every process with
``--threads`` CPU threads. The script starts ``torch.distributed.run`` once per world size
(``--worlds 1,2``) and prints their rows side by side: the task's wall time on rank 0, the
images per second of its optimizer steps, and the speed-up over the first world size. The
timing starts after the join (which imports what torch imports once per process on a run's
first optimizer, see ``espn.training.distributed.join``) and a barrier.

Below it, per world size and rank, the seconds of each part of the task, wall
(``perf_counter``) and CPU (``process_time``): the steps (``sharded_step``; the gathers of the
slices' gradients and statistics within them), the prune events and the commit (the
``check_same`` digests within both, the recalibration within the commit), and the rest
(batches, optimizer steps, slim copies); on a shared
machine read the CPU seconds: what does not halve with 2 ranks is what the ranks repeat.

    python benchmarks/distributed_throughput.py --worlds 1,2 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from step_cost import SETTINGS, synthetic_task

from espn import create_method
from espn.models.registry import ModelSpec, build_supernet
from espn.training import distributed
from espn.training import engine as engine_module
from espn.training.distributed import join
from espn.training.engine import Engine

#: the timed parts: the module or class, the attribute, the part's name
PARTS = [
    (engine_module, "sharded_step", "steps"),
    (distributed, "_gathered_rows", "gathers"),
    (Engine, "_prune_event", "prune events"),
    (distributed.Ranks, "check_same", "check_same"),
    (engine_module, "recalibrate", "recalibrate"),
    (Engine, "_commit", "commit"),
]


def timed(seconds: dict[str, list[float]]) -> None:
    """Wrap each of :data:`PARTS` to add its wall and CPU seconds to ``seconds[part]``."""
    for owner, name, part in PARTS:
        seconds[part] = [0.0, 0.0]

        def wrapper(*args: Any, _inner: Any = getattr(owner, name), _part: str = part) -> Any:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return _inner(*args)
            finally:
                seconds[_part][0] += time.perf_counter() - wall
                seconds[_part][1] += time.process_time() - cpu

        setattr(owner, name, wrapper)


def worker(args: argparse.Namespace) -> None:
    """One rank: train the task, write its time, step count and parts' seconds to
    ``args.report``-RANK."""
    torch.set_num_threads(args.threads)
    setting = SETTINGS[args.model]
    spec = ModelSpec(setting.shape, 10, setting.multi_head, stream_pruning="per-conv")
    supernet = build_supernet(setting.model, spec, torch.zeros(2, *setting.shape), 0, "cpu")
    strategy = create_method(args.method, epochs=(1, 1, 1), warmup=0)
    engine = Engine(supernet, strategy, setting.optim, args.batch, seed=0)
    engine.ranks = join(True, "cpu")
    task = synthetic_task("task 0", setting, args.batch * args.steps, 1, "cpu")
    parts: dict[str, list[float]] = {}
    timed(parts)
    if engine.ranks is not None:
        engine.ranks.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    log = engine.train_task(task, 0)
    parts["task"] = [time.perf_counter() - start, time.process_time() - cpu]
    steps = sum(p["steps"] for p in log.phases)
    rank = 0 if engine.ranks is None else engine.ranks.rank
    report = {"seconds": parts["task"][0], "steps": steps, "parts": parts}
    Path(f"{args.report}-{rank}").write_text(json.dumps(report))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18-reduced", choices=sorted(SETTINGS))
    parser.add_argument("--method", default="espn")
    parser.add_argument("--worlds", default="1,2", help="world sizes, comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    parser.add_argument("--batch", type=int, default=64, help="the global batch")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per epoch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    rows = []
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
    with tempfile.TemporaryDirectory() as tmp:
        for world in [int(w) for w in args.worlds.split(",")]:
            report = Path(tmp) / f"world-{world}"
            forwarded = [*sys.argv[1:], "--worker", "--report", str(report)]
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}"]
            command += [f"--master-port={free_port()}", __file__, *forwarded]
            subprocess.run(command, env=env, check=True)
            rows.append(
                (world, [json.loads(Path(f"{report}-{r}").read_text()) for r in range(world)])
            )
    print(
        f"{args.model}, {args.method}, global batch {args.batch}, {args.threads} thread(s)/process"
    )
    print(f"{'processes':>9}  {'task s':>8}  {'steps':>5}  {'images/s':>9}  {'speed-up':>8}")
    base = None
    for world, ranks in rows:
        r = ranks[0]
        rate = r["steps"] * args.batch / r["seconds"]
        base = base or rate
        print(f"{world:>9}  {r['seconds']:8.2f}  {r['steps']:>5}  {rate:9.1f}  {rate / base:8.2f}x")
    names = [*(part for _, _, part in PARTS), "rest", "task"]
    print("\nseconds per part, wall / CPU:")
    print(f"{'processes':>9}  {'rank':>4}  " + "  ".join(f"{n:>13}" for n in names))
    for world, ranks in rows:
        for rank, r in enumerate(ranks):
            parts = r["parts"]
            # the gathers run within the steps, check_same within the prune events and the
            # commit, the recalibration within the commit
            outer = ("steps", "prune events", "commit")
            parts["rest"] = [
                t - sum(parts[p][i] for p in outer) for i, t in enumerate(parts["task"])
            ]
            cells = "  ".join(f"{parts[n][0]:6.2f}/{parts[n][1]:6.2f}" for n in names)
            print(f"{world:>9}  {rank:>4}  {cells}")


if __name__ == "__main__":
    main()
