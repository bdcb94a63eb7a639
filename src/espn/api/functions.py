"""espn from Python: wrap your own model, learn tasks from your own data, evaluate, export,
save and load.

* :func:`wrap` turns any ``nn.Module`` (FC or conv, torchvision-style ResNets, your own)
  into a supernet, given an example input;
* :class:`ContinualLearner` learns one task per :meth:`~ContinualLearner.learn` call from
  ``(x, y)`` tensors or any iterable of ``(x, y)`` batches (a ``DataLoader``), with a method
  chosen by name or class and its own settings, through the one training engine;
* :meth:`ContinualLearner.save` and :func:`load` write and read the same checkpoint
  ``espn run`` writes, so ``espn evaluate/info/export`` read a run saved from Python and
  :func:`load` reads a CLI run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from espn.api import checks
from espn.api.learner import ContinualLearner, LearnerError
from espn.checkpoint.format import checkpoint_dir, read_manifest
from espn.models.reference import (
    ModelReferenceError,
    build,
    check_factory,
    reference_of,
    supernet_ready,
)
from espn.models.registry import MODELS, ModelSpec, build_supernet
from espn.models.resnet import STREAM_PRUNING
from espn.runs.loading import example_input, known_model, load_run
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
    """A supernet of ``model``, traced on ``example_input`` (a small batch of inputs).

    ``model`` is a plain ``nn.Module`` (its ``nn.Conv2d``/``nn.Linear`` layers become masked
    layers, its ``nn.BatchNorm2d``/``nn.GroupNorm`` task norms, its last linear layer the task
    head, see
    :mod:`espn.models.convert`; the model is copied), a module already made of espn's masked
    layers (used as it is), a registered model name (``"resnet18"``, with ``n_classes``), or
    a class or factory function with its keyword arguments (``wrap(Net, x, width=8)``,
    ``wrap(torchvision.models.resnet18, x, num_classes=10)``), or its import reference
    ``"package.module:Net(width=8)"``: built that way, a saved run records how to rebuild the
    model, so that ``espn evaluate/export`` can rebuild it (``espn info`` reads any run, the
    model never built). ``multi_head``: one head per
    task (else one shared, masked head); ``task_affine``: per-task gate scales and shifts
    (beyond the paper); ``stream_pruning``: how a registered ResNet's residual streams are
    pruned, ``"per-conv"`` (the authors', the default) or ``"coupled"`` (see ``espn.models.resnet``; a
    converted model's streams are coupled).
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
        name = f"<{type(model).__module__}.{type(model).__qualname__} instance>"
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
            name = f"<{type(plain).__module__}.{type(plain).__qualname__} instance>"
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
    """A learner holding every task of the run saved in ``path`` (by :meth:`ContinualLearner.
    save` or ``espn run``), ready to evaluate, export or learn more tasks with the run's
    method and settings.

    The model is rebuilt from the checkpoint's record, or from ``model`` (and ``model_args``)
    when only your code can build it (a model given to :func:`wrap` as an instance).
    Test data saved with the run is loaded with it; ``benchmark_data`` also builds the
    benchmark of an ``espn run`` run, so that its tasks evaluate without data given (read
    from ``data_dir``, default the data directory the run recorded; nothing is downloaded).
    A module the run names (an import reference) is imported only if it is already imported
    here or ``trust_model_code`` is set: opening a run directory never runs code it names.
    """
    from espn.models.reference import reading_run

    manifest = read_manifest(checkpoint_dir(path))
    name = str(manifest["model"])
    given = None
    if model is not None:
        with reading_run(path, trust_model_code):
            known_model(name)
        spec = manifest["spec"]
        given = wrap(
            model,
            example_input(spec, device),
            multi_head=bool(spec["multi_head"]),
            task_affine=bool(manifest["config"].get("task_affine", default("task_affine"))),
            **model_args,
        )
    loaded = load_run(path, device, supernet=given, trust_code=trust_model_code)
    loaded.supernet.model_name = name
    learner = ContinualLearner.from_config(loaded.supernet, loaded.config, progress=progress)
    learner.hold_run(loaded, benchmark_data, data_dir)
    return learner


__all__ = ["ContinualLearner", "LearnerError", "load", "wrap"]
