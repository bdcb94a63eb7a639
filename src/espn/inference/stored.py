"""Checking the statistics a run directory stores for task-agnostic prediction when the run is
read (docs/reliability.md, "Task statistics are checked when a run is read")."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from espn.checkpoint.format import CheckpointError
from espn.inference.outputs import alive_features, head_name
from espn.inference.routing import CANDIDATES, OPTION_KEYS
from espn.inference.statistics import SCORES, STAT_KEYS
from espn.inference.subspace import K
from espn.supernet.supernet import Supernet

#: the statistics whose every value must be above zero (variances, the calibration's deviations)
POSITIVE = ("variance", "input_variance", "input_eigen", "input_noise", "input_weight")


def expected_shapes(supernet: Supernet, task: int, head: str) -> dict[str, tuple[int, ...]]:
    """The shape of each statistic of task ``task``: from its class count, the alive inputs
    of its head (``head``), the model's input size and the number of input components the
    task stores (its ``input_weight``'s length)."""
    classes = int(supernet.masks[task].n_classes)
    features = len(alive_features(supernet, task, head))
    inputs = math.prod(supernet.input_shape)
    # the input and its differences along every axis after the channel (none for flat inputs)
    edges = inputs * max(len(supernet.input_shape), 1)
    weight = supernet.masks[task].stats.get("input_weight")
    parts = max(len(weight), 1) if weight is not None and weight.dim() == 1 else 1
    return {
        "class_means": (classes, features),
        "variance": (features,),
        "input_means": (classes, inputs),
        "input_variance": (inputs,),
        "calibration": (len(SCORES), 2),
        "input_centres": (parts, edges),
        "input_basis": (parts, K, edges),
        "input_eigen": (parts, K),
        "input_noise": (parts,),
        "input_weight": (parts,),
        "held_out_picked": (len(CANDIDATES),),
    }


def _problem(name: str, value: Tensor, shape: tuple[int, ...]) -> str | None:
    """What is wrong with statistic ``name`` (None: nothing)."""
    if value.dtype != torch.float32:
        return f"is {str(value.dtype).removeprefix('torch.')}, not float32"
    if tuple(value.shape) != shape:
        return f"has shape {list(value.shape)}, not {list(shape)}"
    if name == "held_out_picked":  # NaN: a rule that could not run on the task
        shares = value[~value.isnan()]
        return (
            None if bool(((shares >= 0) & (shares <= 1)).all()) else "holds a share outside [0, 1]"
        )
    if not bool(torch.isfinite(value).all()):
        return "holds NaN or infinite values"
    if name in POSITIVE and not bool((value > 0).all()):
        return "holds a variance that is not above zero"
    if name == "calibration" and not bool((value[:, 1] > 0).all()):
        return "holds a standard deviation that is not above zero"
    return None


def check_statistics(supernet: Supernet, where: object) -> None:
    """Refuse (:class:`~espn.checkpoint.format.CheckpointError`, one line naming the task and
    the statistic) statistics of ``supernet``'s tasks that espn cannot have written: unknown
    or missing names, another dtype or shape than the model gives, NaN or infinite values,
    variances or deviations not above zero. A task without statistics (learned without
    training data, or by an espn before them) is left as it is."""
    stored = [t for t, m in enumerate(supernet.masks) if m.stats]
    if not stored:
        return
    head = head_name(supernet)
    for t in stored:
        stats = supernet.masks[t].stats
        # a task learned with ``task_agnostic`` stores every one of OPTION_KEYS too
        keys = (*STAT_KEYS, *OPTION_KEYS) if set(OPTION_KEYS) & set(stats) else STAT_KEYS
        unknown = sorted(set(stats) - set(keys))
        missing = [k for k in keys if k not in stats]
        if unknown or missing:
            what = f"unknown statistic(s) {unknown}" if unknown else f"no {missing}"
            raise CheckpointError(
                f"{where}: task {t} stores {what} for task-agnostic prediction (espn writes "
                f"{', '.join(STAT_KEYS)}, and {', '.join(OPTION_KEYS)} with task_agnostic), "
                "so the task file was changed or damaged"
            )
        shapes = expected_shapes(supernet, t, head)
        for name in keys:
            shape = shapes[name]
            problem = _problem(name, stats[name], shape)
            if problem is not None:
                raise CheckpointError(
                    f"{where}: task {t}: statistic {name!r} {problem}; espn never writes "
                    "that, so the task file was changed or damaged"
                )
