"""Peak resident memory per stage of the compatibility matrix's ``check`` on one model, in
bytes per parameter: what each stage (wrap, learn task 0/1, export task 0/1, the timing)
holds beyond the process before the model was built. A thread samples the RSS.

    python benchmarks/matrix_memory.py torchvision/regnet_y_8gf torchvision/vit_b_32
"""

from __future__ import annotations

import argparse
import functools
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import model_matrix  # benchmarks/, beside this script
import psutil
import torch


class Peaks:
    """The largest RSS sampled while each named stage runs (every 5 ms)."""

    def __init__(self) -> None:
        self.stage = "before"
        self.peak: dict[str, int] = {}
        #: per stage: the espn frames running at its peak, innermost first
        self.where: dict[str, str] = {}
        self.process = psutil.Process()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self) -> None:
        main = threading.main_thread().ident
        while not self.stop.is_set():
            rss = self.process.memory_info().rss
            if rss > self.peak.get(self.stage, 0):
                self.peak[self.stage] = rss
                try:  # the main thread's frames change under the walk
                    frames = traceback.extract_stack(sys._current_frames()[main])
                except (AttributeError, KeyError, ValueError):
                    frames = traceback.StackSummary()
                self.where[self.stage] = " < ".join(
                    f"{f.name}:{f.lineno}" for f in reversed(frames) if "/espn/" in f.filename
                )[:200]
            time.sleep(0.005)

    def during(self, name: Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            stage = self.stage = name(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stage = f"after {stage}"

        return wrapped


def measure(name: str) -> tuple[dict[str, Any], Peaks, int]:
    import espn

    (entry,) = [e for e in model_matrix.entries() if e.name == name]
    peaks = Peaks()
    base = peaks.process.memory_info().rss
    peaks.thread.start()
    built = [0]

    def build_name() -> str:
        built[0] += 1
        return "build" if built[0] == 1 else "timing"

    entry.build = peaks.during(build_name, entry.build)
    espn.wrap = peaks.during(lambda *a, **k: "wrap", espn.wrap)
    learner = espn.ContinualLearner
    tasks = [0]

    def learn_name(*a: Any, **k: Any) -> str:
        tasks[0] += 1
        return f"learn task {tasks[0] - 1}"

    learner.learn = peaks.during(learn_name, learner.learn)  # type: ignore[method-assign]
    learner.export = peaks.during(  # type: ignore[method-assign]
        lambda self, t, *a, **k: f"export task {t}", learner.export
    )
    model_matrix.timed = peaks.during(lambda *a, **k: "timing", model_matrix.timed)
    row = model_matrix.check(entry, model_matrix.Settings())
    peaks.stop.set()
    peaks.thread.join()
    return row, peaks, base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="+")
    parser.add_argument("--where", action="store_true", help="the espn frames at each peak")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.names:
        row, peaks, base = measure(name)
        n = row.get("parameters", 1)
        print(f"{name}: {n / 1e6:.1f} M parameters, {row['verdict']}, base {base / 2**30:.2f} GiB")
        for stage, rss in peaks.peak.items():
            print(f"  {stage:<20} {rss / 2**30:6.2f} GiB  {(rss - base) / n:6.1f} B/param")
            if args.where and peaks.where.get(stage):
                print(f"      at {peaks.where[stage]}")


if __name__ == "__main__":
    main()
