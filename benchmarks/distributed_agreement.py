"""Agreement of a data-parallel run with one process, per method (docs/distributed.md).

For each method, the 3-task run of ``tests/helpers/ddp_run.py`` (pixel-permuted digits on a
small CNN with BatchNorm) is trained by 2 gloo processes and by 1 process, the latter once
with ``--shards 2`` (the 2 ranks' slices, computed one after the other) and once plainly (the
whole batch at once), every process on one thread. Prints per method and 1-process run the
fraction of owner ids and of mask entries equal to the 2 ranks' after the 3 tasks, whether
the supernets are bit-identical, and the largest accuracy difference in points.

    python benchmarks/distributed_agreement.py [--methods espn,packnet,...]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HELPER = Path(__file__).resolve().parents[1] / "tests" / "helpers" / "ddp_run.py"
METHODS = "espn,packnet,supsup,cpg,rmn,individual,mtl"


def run(method: str, out: Path, ranks: int, *extra: str) -> dict[str, Any]:
    """The helper's run by ``ranks`` processes; rank 0's report."""
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    args = [str(HELPER), method, str(out / "run"), str(out / "report"), *extra]
    if ranks > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        args = [
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            f"--master-port={port}",
            *args,
        ]
    subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True)
    return json.loads((out / "report" / "rank-0.json").read_text())


def flat(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [v for k in sorted(value) for v in flat(value[k])]
    if isinstance(value, list):
        return [v for item in value for v in flat(item)]
    return [value]


def agree(a: Any, b: Any) -> float:
    x, y = flat(a), flat(b)
    return sum(u == v for u, v in zip(x, y, strict=True)) / len(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--methods", default=METHODS)
    args = parser.parse_args()
    print("method      1 process        owners   masks    supernet   accuracy diff")
    for method in args.methods.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            two = run(method, Path(tmp) / "two", 2)
            for label, extra in (("--shards 2", ("--shards", "2")), ("plain", ())):
                one = run(method, Path(tmp) / label.strip("-").replace(" ", ""), 1, *extra)
                last_one, last_two = one["states"][-1], two["states"][-1]
                diff = max(
                    abs(a - b)
                    for r1, r2 in zip(one["accuracy"], two["accuracy"], strict=True)
                    for a, b in zip(r1, r2, strict=True)
                )
                same = "identical" if one["digest"] == two["digest"] else "differs"
                print(
                    f"{method:<11} {label:<16} {agree(last_one['owners'], last_two['owners']):.4f}"
                    f"   {agree(last_one['masks'], last_two['masks']):.4f}   {same:<10} {diff:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
