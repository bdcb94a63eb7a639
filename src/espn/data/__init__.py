"""Benchmarks (task sequences held as tensors on the device), found by name in BENCHMARKS."""

from espn.data import cifar, folders, mnist, tensors
from espn.data.joint import JointTask
from espn.data.offline import fashion_mnist
from espn.data.registry import BENCHMARKS, Benchmark, BenchmarkArgs
from espn.data.sources import DatasetUnavailable, load_mnist_like
from espn.data.tasks import Split, Task, TaskSequence

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "BenchmarkArgs",
    "DatasetUnavailable",
    "JointTask",
    "Split",
    "Task",
    "TaskSequence",
    "cifar",
    "fashion_mnist",
    "folders",
    "load_mnist_like",
    "mnist",
    "tensors",
]
