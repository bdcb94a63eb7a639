"""espn from Python: :func:`wrap` your own model into a supernet, learn with a
:class:`ContinualLearner`, and :func:`load` a run ``espn run`` or ``save`` wrote (see
docs/python.md)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from espn.api import checks
from espn.api.learner import ContinualLearner, LearnerError
from espn.models.reference import (
    ModelReferenceError,
    build,
    check_factory,
    reference_of,
    supernet_ready,
)
from espn.models.registry import MODELS, ModelSpec, build_supernet
from espn.models.resnet import STREAM_PRUNING
from espn.runs.loading import example_input, instance_name, load_run
from espn.settings.training import default
from espn.supernet.supernet import Supernet


def wrap(
    model: nn.Module | str | Callable[..., nn.Module],
    example_input: Tensor,
    *,
    multi_head: bool = True,
    task_affine: bool = default("task_affine"),
    stream_pruning: str = default("stream_pruning"),
    **model_args: Any,
) -> Supernet:
    """A supernet of ``model``, traced on ``example_input`` (a small batch of inputs); see
    docs/models.md.

    ``model``: a plain ``nn.Module`` (copied and converted), a module of espn's masked layers
    (used as it is), a registered model name (with ``n_classes``), a class or factory with its
    keyword arguments (``wrap(Net, x, width=8)``) or its import reference
    ``"package.module:Net(width=8)"`` (a saved run then records how to rebuild the model).
    ``multi_head``: one head per task (else one shared, masked head); ``task_affine``: per-task
    gate scales and shifts; ``stream_pruning``: how a registered ResNet's residual streams are
    pruned (``"per-conv"`` or ``"coupled"``).
    """
    checks.check_example(model, example_input)
    if stream_pruning not in STREAM_PRUNING:
        raise checks.ApiArgumentError(
            f"stream_pruning must be one of: {', '.join(STREAM_PRUNING)}, got {stream_pruning!r}"
        )
    with checks.about("example_input", "the model cannot be built and run on it: "):
        return _wrap(model, example_input, multi_head, task_affine, model_args, stream_pruning)


def _wrap(
    model: nn.Module | str | Callable[..., nn.Module],
    example_input: Tensor,
    multi_head: bool,
    task_affine: bool,
    model_args: dict[str, Any],
    stream_pruning: str,
) -> Supernet:
    if isinstance(model, str) and model in MODELS:
        n_classes = int(model_args.pop("n_classes", 10))
        _no_args(model_args, model)
        shape = tuple(example_input.shape[1:])
        spec = ModelSpec(shape, n_classes, multi_head, task_affine, stream_pruning)
        sn = build_supernet(model, spec, example_input, None, example_input.device)
        sn.model_name, sn.model_classes = model, n_classes
        return sn
    if isinstance(model, nn.Module):
        _no_args(model_args, type(model).__name__)
        name = instance_name(model)
        plain = model
    elif isinstance(model, str):
        _no_args(model_args, model)
        name = model
        plain = build(name).to(example_input.device)
    else:
        try:
            name = reference_of(model, model_args)
        except ModelReferenceError as exc:
            if "not an nn.Module class" in str(exc):
                raise
            # defined in a script, or given non-literal arguments: usable here, but a saved
            # run can only be loaded by passing the model again
            plain = check_factory(model, repr(model))(**model_args)
            name = instance_name(plain)
        else:
            plain = build(name).to(example_input.device)
    ready = supernet_ready(plain, example_input, multi_head, task_affine)
    sn = Supernet(ready, example_input)
    sn.model_name = name
    return sn


def _no_args(args: dict[str, Any], what: str) -> None:
    if args:
        raise checks.ApiArgumentError(
            f"keyword arguments {sorted(args)} given with {what}; they are passed to a class "
            "or factory function (wrap(Net, x, width=8)), not to a model instance"
        )


def load(
    path: Path | str,
    model: nn.Module | Callable[..., nn.Module] | None = None,
    *,
    device: str = default("device"),
    progress: bool = False,
    benchmark_data: bool = False,
    data_dir: Path | str | None = None,
    trust_model_code: bool = False,
    **model_args: Any,
) -> ContinualLearner:
    """A learner holding every task of the run in ``path``, ready to evaluate, export or learn
    more tasks with the run's method and settings (see docs/python.md).

    The model is rebuilt from the checkpoint's record, or from ``model`` (and ``model_args``)
    when only your code can build it. ``benchmark_data`` also builds an ``espn run`` run's
    benchmark (from ``data_dir``, default the recorded one; never downloaded). A module the
    run names is imported only if already imported or ``trust_model_code`` is set.
    """

    def given(manifest: dict[str, Any], model: nn.Module | Callable[..., nn.Module]) -> Supernet:
        spec = manifest["spec"]
        return wrap(
            model,
            example_input(spec, device),
            multi_head=bool(spec["multi_head"]),
            task_affine=bool(manifest["config"].get("task_affine", default("task_affine"))),
            **model_args,
        )

    build = None if model is None else partial(given, model=model)
    loaded = load_run(path, device, build, trust_model_code)
    learner = ContinualLearner.from_config(loaded.supernet, loaded.config, progress=progress)
    learner.hold_run(loaded, benchmark_data, data_dir)
    return learner


__all__ = ["ContinualLearner", "LearnerError", "load", "wrap"]
