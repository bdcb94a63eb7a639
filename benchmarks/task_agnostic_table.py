"""The task-agnostic table of docs/task-agnostic.md: every rule on small real runs.

For each benchmark (rotated and permuted Fashion-MNIST, 10 tasks; split Fashion-MNIST, 5 tasks
of 2 classes) and method (ESPN-0.2, PackNet, SupSup) it trains one run with ``espn run`` on
FC1024 (unless OUT/<benchmark>-<method> already holds a finished run), then recomputes every task's statistics with this espn (the ones a run of it stores when the
task commits) and evaluates every task-inference rule on the tasks' test data (``espn.inference.evaluate_task_agnostic``) and
prints one markdown row per run and rule: accuracy with the task given, task-agnostic
accuracy per sample and per batch of 32, the task picked right (per sample), inference FLOPs
per sample in dense passes. A rule a run cannot use (SupSup's one-shot on ESPN) is left out.

    python benchmarks/task_agnostic_table.py --out runs/agnostic --train 1000 --test 1000 --epochs 1,1,1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = {
    "rotated-fashion-mnist": 10,
    "permuted-fashion-mnist": 10,
    "split-fashion-mnist": 5,
}
METHODS = {"espn": ["--gamma", "0.2"], "packnet": [], "supsup": []}


def train(out: Path, benchmark: str, method: str, args: argparse.Namespace) -> Path:
    """The run directory of ``method`` on ``benchmark``, trained here unless finished."""
    run = out / f"{benchmark}-{method}"
    if (run / "results.json").is_file():
        return run
    command = [
        sys.executable, "-c", "from espn.cli.main import app; app()", "run",
        "--benchmark", benchmark, "--method", method, "--model", "fc1024",
        "--tasks", str(BENCHMARKS[benchmark]), "--epochs", args.epochs,
        "--train-per-task", str(args.train), "--test-per-task", str(args.test),
        "--no-step-floor", "--no-progress", "--quiet", "--out", str(run), "--overwrite",
        *METHODS[method],
    ]  # fmt: skip
    print(" ".join(command[3:]), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/agnostic"))
    parser.add_argument("--train", type=int, default=1000, help="training images per task")
    parser.add_argument("--test", type=int, default=1000, help="test images per task")
    parser.add_argument("--epochs", default="1,1,1")
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()

    from espn.experiment import build_benchmark
    from espn.inference import RULES, InferenceError, evaluate_rules, get_rule, task_statistics
    from espn.runs.loading import load_run

    print("| benchmark | method | rule | task given | per sample | per batch of 32 | task picked "
          "right | FLOPs (dense passes) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    figures = []
    for benchmark in args.benchmarks.split(","):
        for method in args.methods.split(","):
            run = train(args.out, benchmark, method, args)
            loaded = load_run(run, "cpu")
            seq = build_benchmark(loaded.config)
            tasks = [seq.tasks[t] for t in range(loaded.n_tasks)]
            for t, task in enumerate(tasks):  # as this espn stores them when a task commits
                loaded.supernet.masks[t].stats = task_statistics(loaded.supernet, t, task)
            usable = []
            for rule in RULES:
                try:
                    usable.append(get_rule(rule, loaded.supernet))
                except InferenceError:
                    continue  # SupSup's one-shot on a run of another method
            for doc in evaluate_rules(loaded.supernet, tasks, usable):
                avg = doc["average"]
                figures.append({"benchmark": benchmark, "method": method} | doc)
                print(
                    f"| {benchmark} | {method} | {doc['rule']} | {avg['given']:.2f} | "
                    f"{avg['per_sample']:.2f} | {avg['per_batch']:.2f} | "
                    f"{avg['task_picked']:.2f} | {doc['flops_passes']:.2f} |",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
