"""Throughput of one task trained by 1 process and by N data-parallel processes (gloo).

Each world size trains the same task with the same global batch: synthetic CIFAR-sized
images (crop+flip) on ``--model`` (default the reduced ResNet-18), ``--method``'s whole task
(its phases, prune events, BatchNorm recalibration and commit), every process with
``--threads`` CPU threads. The script starts ``torch.distributed.run`` once per world size
(``--worlds 1,2``) and prints their rows side by side: the task's wall time on rank 0, the
images per second of its optimizer steps, and the speed-up over the first world size.

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

import torch
from step_cost import SETTINGS, synthetic_task

from espn import create_method
from espn.models.registry import ModelSpec, build_supernet
from espn.training.distributed import join
from espn.training.engine import Engine


def worker(args: argparse.Namespace) -> None:
    """One rank: train the task, rank 0 writes its time and step count to ``args.report``."""
    torch.set_num_threads(args.threads)
    setting = SETTINGS[args.model]
    spec = ModelSpec(setting.shape, 10, setting.multi_head, stream_pruning="per-conv")
    supernet = build_supernet(setting.model, spec, torch.zeros(2, *setting.shape), 0, "cpu")
    strategy = create_method(args.method, epochs=(1, 1, 1), warmup=0)
    engine = Engine(supernet, strategy, setting.optim, args.batch, seed=0)
    engine.ranks = join(True, "cpu")
    task = synthetic_task("task 0", setting, args.batch * args.steps, 1, "cpu")
    if engine.ranks is not None:
        engine.ranks.barrier()
    start = time.perf_counter()
    log = engine.train_task(task, 0)
    seconds = time.perf_counter() - start
    steps = sum(p["steps"] for p in log.phases)
    if engine.ranks is None or engine.ranks.writer:
        Path(args.report).write_text(json.dumps({"seconds": seconds, "steps": steps}))


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
            report = Path(tmp) / f"world-{world}.json"
            forwarded = [*sys.argv[1:], "--worker", "--report", str(report)]
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}"]
            command += [f"--master-port={free_port()}", __file__, *forwarded]
            subprocess.run(command, env=env, check=True)
            rows.append((world, json.loads(report.read_text())))
    print(
        f"{args.model}, {args.method}, global batch {args.batch}, {args.threads} thread(s)/process"
    )
    print(f"{'processes':>9}  {'task s':>8}  {'steps':>5}  {'images/s':>9}  {'speed-up':>8}")
    base = None
    for world, r in rows:
        rate = r["steps"] * args.batch / r["seconds"]
        base = base or rate
        print(f"{world:>9}  {r['seconds']:8.2f}  {r['steps']:>5}  {rate:9.1f}  {rate / base:8.2f}x")


if __name__ == "__main__":
    main()
