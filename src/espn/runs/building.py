"""What a run configuration names, built: its task sequence and its supernet."""

from __future__ import annotations

import torch

from espn.data.order import ordered
from espn.data.registry import BENCHMARKS, BenchmarkArgs
from espn.data.tasks import TaskSequence, prepended
from espn.models import registry as models
from espn.models.registry import ModelSpec
from espn.runs.config import RunConfig
from espn.runs.from_run import open_source
from espn.supernet.supernet import Supernet


def build_benchmark(cfg: RunConfig, download: bool = True) -> TaskSequence:
    """The task sequence ``cfg`` names, on its device: the benchmark's tasks in
    ``task_order``, after the tasks kept from ``from_run``; without ``download`` a dataset
    missing from ``data_dir`` is refused, not fetched (a saved run's data is only read)."""
    sizes = cfg.task_train_sizes()
    args = BenchmarkArgs(
        n_tasks=cfg.tasks,
        seed=cfg.seed if cfg.task_seed is None else cfg.task_seed,
        class_order=cfg.class_order,
        train_per_task=cfg.train_per_task,
        test_per_task=cfg.test_per_task,
        data_dir=cfg.data_dir,
        device=torch.device(cfg.device),
        folders=tuple(cfg.folders),
        image_size=cfg.image_size,
        train_sizes=None if sizes is None else tuple(sizes),
        download=download,
    )
    seq = ordered(BENCHMARKS.get(cfg.benchmark).build(args), cfg.task_order, args.seed)
    source = open_source(cfg)
    if source is None:
        return seq
    return prepended(build_benchmark(source.config, download=False), source.keep, seq)


def build_supernet(cfg: RunConfig, seq: TaskSequence) -> Supernet:
    """The model named in ``cfg``, wrapped as a supernet on ``cfg.device``."""
    spec = ModelSpec(
        seq.input_shape, seq.n_classes, seq.multi_head, cfg.task_affine, cfg.stream_pruning
    )
    first = seq.tasks[0]
    example = first.transform(first.train.x[first.train.index[:2]], False)
    return models.build_supernet(str(cfg.model), spec, example, cfg.seed, cfg.device)
