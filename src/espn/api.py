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

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from espn import api_checks as checks
from espn.checkpoint.format import CheckpointError, checkpoint_dir, read_manifest
from espn.checkpoint.run import check_out_dir, load_run, run_meta
from espn.checkpoint.store import CheckpointWriter
from espn.config import RunConfig, make_config, run_settings
from espn.data.tasks import Split, Task, TaskSequence
from espn.data.tensors import (
    TaskData,
    identity,
    load_task,
    save_task,
    task_path,
    tensor_task,
)
from espn.errors import EspnError
from espn.evaluation.metrics import task_accuracy
from espn.experiment import build_benchmark, results_document
from espn.export.export import ExportReport, check_target, export_task
from espn.learning import TaskRunner, task_record
from espn.methods.base import METHODS, Strategy, create_method
from espn.models.reference import (
    ModelReferenceError,
    build,
    check_factory,
    reference_of,
    supernet_ready,
)
from espn.models.registry import MODELS, ModelSpec, build_supernet
from espn.models.resnet import STREAM_PRUNING
from espn.supernet.supernet import Supernet
from espn.training.engine import Engine
from espn.training.optim import OptimConfig
from espn.utils.io import write_json_atomic


class LearnerError(EspnError, ValueError):
    """A learner cannot do what was asked (no data to evaluate on, an unreachable budget,
    nothing to save); the message says why and what would work."""


#: the batch size when neither the learner nor a DataLoader gives one
DEFAULT_BATCH_SIZE = 128
#: where a saved run keeps the test data its accuracy matrix was computed on
DATA_DIR = "data"


def wrap(
    model: nn.Module | str | Callable[..., nn.Module],
    example_input: Tensor,
    *,
    multi_head: bool = True,
    task_affine: bool = False,
    stream_pruning: str = "per-conv",
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
    model, so that ``espn evaluate/info/export`` can read it. ``multi_head``: one head per
    task (else one shared, masked head); ``task_affine``: per-task gate scales and shifts
    (beyond the paper); ``stream_pruning``: how a registered ResNet's residual streams are
    pruned, ``"per-conv"`` (the authors') or ``"coupled"`` (see ``espn.models.resnet``; a
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
    stream_pruning: str = "per-conv",
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


def _strategy(method: str | type[Strategy] | Strategy, settings: dict[str, Any]) -> Strategy:
    """The method's strategy, by name or class with its own settings, or as given."""
    if isinstance(method, Strategy):
        if settings:
            raise TypeError(f"settings {sorted(settings)} given with a built strategy")
        return method
    return create_method(method, **settings)


def _record_streams(strategy: Strategy, supernet: Supernet, settings: dict[str, Any]) -> None:
    """The residual streams are built with the model (``wrap``): a method's ``stream_pruning``
    records how they were, and one given that differs is refused."""
    built = supernet.stream_pruning
    asked = settings.get("stream_pruning")
    if asked is not None and built is None:
        raise checks.ApiArgumentError(
            f"stream_pruning={asked!r}, but the supernet has no residual stream for it to "
            "prune; leave it unset"
        )
    if "stream_pruning" not in strategy.settings or built is None:
        return
    if asked is not None and asked != built:
        raise checks.ApiArgumentError(
            f"stream_pruning={asked!r}, but the supernet's residual streams are {built}: they "
            f"are built with the model, by espn.wrap(..., stream_pruning={asked!r})"
        )
    strategy.settings["stream_pruning"] = built


class ContinualLearner:
    """Learns tasks one after another into ``supernet`` with one method.

    ``method`` is a method name (``espn.methods.METHODS``), a :class:`Strategy` class, or a
    built strategy; ``settings`` are the method's own (``gamma=0.2``, ``alpha=0.1``,
    ``epochs=(3, 4, 3)`` for pre-training, pruning and fine-tuning, ...). The optimizer
    (``"adam"``, ``"sgd"``, ``"rmsprop"``), learning rate, batch size (default: a DataLoader's,
    else 128) and seed drive the one training engine that ``espn run`` uses; ``device``
    moves the supernet there (default: where it is).
    """

    def __init__(
        self,
        supernet: Supernet,
        method: str | type[Strategy] | Strategy = "espn",
        *,
        optimizer: str = "adam",
        lr: float = 1e-3,
        batch_size: int | None = None,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        device: str | torch.device | None = None,
        seed: int = 0,
        progress: bool = False,
        **settings: Any,
    ) -> None:
        checks.check_learner(
            supernet,
            device,
            settings,
            optimizer=optimizer,
            lr=lr,
            batch_size=batch_size,
            weight_decay=weight_decay,
            momentum=momentum,
            betas=betas,
            seed=seed,
        )
        if device is not None:
            supernet.to(device)
            supernet.owners.to(device)
        self.supernet = supernet
        with checks.about("settings"):
            self.strategy = _strategy(method, settings)
        _record_streams(self.strategy, supernet, settings)
        self.optim = OptimConfig(optimizer, lr, weight_decay, momentum, (betas[0], betas[1]))
        self.batch_size, self.seed = batch_size, seed
        self.engine = Engine(
            supernet, self.strategy, self.optim, batch_size or DEFAULT_BATCH_SIZE, seed, progress
        )
        self.device = next(supernet.parameters()).device
        #: per learned task: its data (None: not known here, e.g. a task loaded from a run)
        self.tasks: list[Task | None] = [None] * len(supernet.masks)
        self.names: list[str] = [f"task {t}" for t in range(len(supernet.masks))]
        #: learns and records every task (one accuracy row per task learned, None: not
        #: evaluated; one record per task), as ``espn run`` does
        self.runner = TaskRunner(
            supernet,
            self.strategy,
            self.engine,
            [None] * len(supernet.masks),
            [task_record(supernet, t) for t in range(len(supernet.masks))],
        )

    @property
    def rows(self) -> list[list[float] | None]:
        """One accuracy row per learning step (see :attr:`accuracy_matrix`)."""
        return self.runner.rows

    @rows.setter
    def rows(self, value: list[list[float] | None]) -> None:
        self.runner.rows = value

    @property
    def records(self) -> list[dict[str, Any]]:
        """One record per learned task: FLOPs, weights, budget, time, data sizes."""
        return self.runner.records

    @records.setter
    def records(self, value: list[dict[str, Any]]) -> None:
        self.runner.records = value

    # ------------------------------------------------------------------ learning
    def learn(
        self,
        data: TaskData,
        test: TaskData | None = None,
        *,
        n_classes: int | None = None,
        name: str | None = None,
    ) -> dict[str, Any]:
        """Learn one task from ``data`` (``(x, y)`` tensors or an iterable of ``(x, y)``
        batches, gathered once onto the device) and return its record (FLOPs, weights).

        With ``test`` data, every task learned so far that has test data is evaluated after
        it: the task's row of :attr:`accuracy_matrix`. ``n_classes`` defaults to the largest
        label + 1.
        """
        checks.check_data_given(data, "data")
        checks.check_name(name)
        if n_classes is not None:
            checks.check_classes(n_classes)
        if self._joint():
            raise LearnerError(
                f"method {self.strategy.name!r} trains all tasks together, not one at a time; "
                "give them all at once: learn_all([(train, test), ...])"
            )
        (task,) = self._tasks([(data, test)], [n_classes], [name])
        self._prepare(data)
        self._learn_steps([task], [task])
        return self.records[-1]

    def learn_all(
        self,
        tasks: Sequence[tuple[TaskData, TaskData | None]],
        *,
        n_classes: Sequence[int | None] | None = None,
        names: Sequence[str | None] | None = None,
    ) -> list[dict[str, Any]]:
        """Learn several tasks, each ``(train, test)`` data as in :meth:`learn`: one after
        another, or all together for a method that trains them jointly (MTL: one accuracy
        row, after the joint training); their records, in order."""
        if not self._joint():
            n = len(self.records)
            for t, (data, test) in enumerate(tasks):
                self.learn(
                    data,
                    test,
                    n_classes=None if n_classes is None else n_classes[t],
                    name=None if names is None else names[t],
                )
            return self.records[n:]
        if self.supernet.masks:
            raise LearnerError(
                f"method {self.strategy.name!r} learns all its tasks in one call; this learner "
                f"already holds {len(self.supernet.masks)} task(s)"
            )
        given = self._tasks(tasks, n_classes, names)
        self._prepare(tasks[0][0] if tasks else None)
        seq = TaskSequence("tensors", given, tuple(self.supernet.input_shape), self._multi_head())
        self._learn_steps(self.strategy.training_tasks(seq), given)
        return list(self.records)

    def _learn_steps(self, steps: Sequence[Task], tasks: list[Task]) -> None:
        """Learn ``steps`` (committing ``tasks``) through the runner; the tasks are kept as
        learned once the supernet holds them (a task over budget too: it is recorded)."""
        known = [*self.tasks, *tasks]
        try:
            for step in steps:
                self.runner.learn(step, len(self.runner.rows), known)
        finally:
            learned = len(self.supernet.masks) - len(self.tasks)
            self.tasks += tasks[:learned]
            self.names += [t.name for t in tasks[:learned]]

    def _joint(self) -> bool:
        """Whether the method trains every task at once (MTL), not one at a time."""
        return type(self.strategy).training_tasks is not Strategy.training_tasks

    def _tasks(
        self,
        data: Sequence[tuple[TaskData, TaskData | None]],
        n_classes: Sequence[int | None] | None,
        names: Sequence[str | None] | None,
    ) -> list[Task]:
        """The given data as tasks on the device, named ``task N`` unless named."""
        if not data:
            raise LearnerError("no task given: pass one (train, test) pair per task")
        tasks = []
        for t, (train, test) in enumerate(data):
            name = (names[t] if names is not None else None) or f"task {len(self.tasks) + t}"
            classes = None if n_classes is None else n_classes[t]
            # forked: a loader's draws leave training's alone
            with torch.random.fork_rng(devices=[]), checks.about("data", test_argument="test"):
                task = tensor_task(name, train, test, classes, self.device)
            checks.check_inputs(task.train.x, "data", self.supernet.input_shape)
            if len(task.test):
                checks.check_inputs(task.test.x, "test", self.supernet.input_shape)
            checks.check_classes(task.n_classes, "n_classes" if classes is not None else "data")
            if not len(task.train):
                raise LearnerError(f"{name}: no training samples")
            tasks.append(task)
        return tasks

    def _prepare(self, data: TaskData | None) -> None:
        """Check the FLOPs budget can be met and take the batch size (the learner's, else a
        DataLoader's, else the default)."""
        self.runner.check_gamma_reachable(self.supernet.model_name)
        loader_batch = getattr(data, "batch_size", None)
        self.engine.batch_size = self.batch_size or (
            loader_batch if isinstance(loader_batch, int) else DEFAULT_BATCH_SIZE
        )

    def _record(self, task: int) -> dict[str, Any]:
        return task_record(self.supernet, task)

    # ---------------------------------------------------------------- evaluation
    @property
    def accuracy_matrix(self) -> list[list[float] | None]:
        """Row ``i``: accuracy (%) of tasks ``0..i`` after task ``i`` was learned (None where
        some task had no test data)."""
        return [None if r is None else list(r) for r in self.rows]

    def evaluate(self, task: int, data: TaskData | None = None) -> float:
        """Accuracy (%) of task ``task``'s sub-network on ``data`` (default: its test data)."""
        self._check_task(task)
        if data is None:
            known = self.tasks[task]
            if known is None or not len(known.test):
                raise LearnerError(f"task {task} has no test data here; pass data=(x, y)")
            return task_accuracy(self.supernet, known, task)
        n_classes = self.supernet.masks[task].n_classes
        with checks.about("data"):
            probe = tensor_task(self.names[task], None, data, n_classes, self.device)
        checks.check_inputs(probe.test.x, "data", self.supernet.input_shape)
        return task_accuracy(self.supernet, probe, task)

    def _check_task(self, task: int) -> None:
        checks.check_task(task, len(self.supernet.masks))

    def report(self) -> list[dict[str, Any]]:
        """Per task: name, classes, FLOPs (and ratio to the dense supernet), weights used and
        new weights owned, units kept; counted from the supernet as it is now."""
        return [
            {"task": t, "name": self.names[t], "n_classes": self.supernet.masks[t].n_classes}
            | self._record(t)
            for t in range(len(self.supernet.masks))
        ]

    def export(
        self,
        task: int,
        path: Path | str,
        data: TaskData | None = None,
        onnx: bool = False,
        fold_bn: bool = True,
        overwrite: bool = False,
    ) -> ExportReport:
        """Write task ``task`` as a slim standalone model (``.pt2`` or ``.onnx``), checked
        against the supernet on ``data``'s inputs (default: the task's test, else training
        data) and against the task's FLOPs (see :func:`espn.export.export.export_task`);
        ``onnx``: with a ``.pt2`` path, also write the ``.onnx`` beside it. Existing files
        (the model, its ``.onnx`` and ``.json``) are replaced only with ``overwrite``, and
        a run directory's own files never."""
        self._check_task(task)
        checks.check_export_path(path)
        check_target(path)
        if data is not None:
            with checks.about("data"):
                x = tensor_task(self.names[task], None, data, None, self.device).test.x
            checks.check_inputs(x, "data", self.supernet.input_shape)
        else:
            known = self.tasks[task]
            if known is None:
                raise LearnerError(
                    f"task {task} has no data here to check the export on; pass data"
                )
            split = "test" if len(known.test) else "train"
            flops = self._record(task)["flops"]  # raw inputs in: the task's transform too
            raw = known.raw_inputs(split, 1024)
            return export_task(
                self.supernet, task, raw, path, onnx, flops, fold_bn, known.transform, overwrite
            )
        inputs = list(x.split(1024))
        flops = self._record(task)["flops"]
        return export_task(
            self.supernet, task, inputs, path, onnx, flops, fold_bn, overwrite=overwrite
        )

    # ------------------------------------------------------------------ saving
    def config(self, out: Path | str) -> RunConfig:
        """The run configuration a checkpoint records for this learner (benchmark
        ``tensors``: the test data saved beside it)."""
        return make_config(
            benchmark="tensors",
            data_dir=Path(DATA_DIR),
            method=self.strategy.name,
            model=self._model_name(),
            tasks=max(len(self.supernet.masks), 1),
            optimizer=self.optim.name,
            lr=self.optim.lr,
            weight_decay=self.optim.weight_decay,
            momentum=self.optim.momentum,
            betas=self.optim.betas,
            batch_size=self.engine.batch_size,
            seed=self.seed,
            device=str(self.device),
            out=Path(out),
            method_options=dict(self.strategy.settings),
            **run_settings(self.strategy.cfg, type(self.strategy)),
        )

    def _model_name(self) -> str:
        name = self.supernet.model_name
        if name is None:
            model = self.supernet.model
            name = f"<{type(model).__module__}.{type(model).__qualname__} instance>"
        _known(name)
        return name

    def save(self, path: Path | str, overwrite: bool = False) -> Path:
        """Save every learned task as ``espn run`` does: ``path/checkpoint`` (safetensors +
        JSON), ``path/results.json``, and the tasks' test data in ``path/data`` (so that
        ``espn evaluate --run path`` re-computes the accuracies). Refuses a directory holding
        another run unless ``overwrite``."""
        path = checks.check_save_path(path)
        if not self.supernet.masks:
            raise LearnerError("nothing to save: no task is learned yet")
        check_out_dir(path, resume=False, overwrite=overwrite)
        cfg = self.config(path)
        seq = self._sequence()
        written = set()
        for t, task in enumerate(self.tasks):
            if task is not None and len(task.test):
                written.add(save_task(task_path(path / DATA_DIR, t), task, splits=("test",)))
        for stale in (path / DATA_DIR).glob("task-*.safetensors"):  # of an overwritten run
            if stale not in written:
                stale.unlink()
        doc = results_document(cfg, seq, self.supernet, self.rows, self.records)
        doc["wall_time_s"] = sum(float(r.get("seconds", 0.0)) for r in self.records)
        write_json_atomic(path / "results.json", doc)
        meta = run_meta(cfg, seq)
        width = self.supernet.model_classes  # the head a registered model was built with
        meta["spec"]["n_classes"] = max(seq.n_classes, width or 1)
        writer = CheckpointWriter(checkpoint_dir(path), meta)
        results = [
            {"name": self.names[t], "record": self.records[t]}
            | (
                {"accuracy": self.rows[t]}
                if t < len(self.rows) and self.rows[t] is not None
                else {}
            )
            for t in range(len(self.records))
        ]
        writer.save(self.supernet, None, results, extra={"complete": True, "saved_by": "api"})
        return path

    def _sequence(self) -> TaskSequence:
        """The learned tasks as a sequence (names and class counts), for the records."""
        empty = Split(torch.zeros(0, 1), torch.zeros(0, dtype=torch.long), torch.zeros(0))
        tasks = [
            Task(self.names[t], empty, empty, identity, m.n_classes)
            for t, m in enumerate(self.supernet.masks)
        ]
        shape = tuple(self.supernet.input_shape)
        return TaskSequence("tensors", tasks, shape, self._multi_head())

    def _multi_head(self) -> bool:
        from espn.supernet.layers import TaskHead

        return any(isinstance(m, TaskHead) for m in self.supernet.task_modules.values())

    # ------------------------------------------------- prediction without the task
    def infer_task(self, x: Tensor, same_task: bool = False, rule: str | None = None) -> Tensor:
        """The task of each sample of ``x`` (a batch of inputs), inferred by ``rule`` (see
        :mod:`espn.inference`; default ``espn.inference.DEFAULT_RULE``); with ``same_task``,
        one task for the whole batch (the samples' scores summed)."""
        from espn.inference import infer

        return infer(self.supernet, self._inputs(x), rule, same_task).tasks

    def predict(
        self,
        x: Tensor,
        task: int | None = None,
        same_task: bool = False,
        rule: str | None = None,
    ) -> Tensor:
        """Class predicted for each sample of ``x`` by task ``task``'s sub-network or, with
        ``task=None``, by the sub-network of the task inferred for it (:meth:`infer_task`):
        where the inferred task is ``t`` the prediction equals ``predict(x, task=t)``."""
        from espn.inference import infer, predict_given

        x = self._inputs(x)
        if task is not None:
            self._check_task(task)
            return predict_given(self.supernet, x, task)
        return infer(self.supernet, x, rule, same_task).classes

    def _inputs(self, x: Tensor) -> Tensor:
        """``x`` checked as a batch of model inputs, on the learner's device."""
        checks.check_inputs(x, "x", self.supernet.input_shape)
        return x.to(self.device)


def _known(name: str) -> None:
    """Let a run configuration name the model: a reference is registered where it may be
    imported, else (an instance's name, a reference not trusted) a factory saying that only
    the caller's code rebuilds it."""
    from espn.models.reference import is_reference, resolve

    def resolves() -> bool:
        try:
            resolve(name)
        except ModelReferenceError:  # not trusted here: only the caller's code rebuilds it
            return False
        return True

    if name in MODELS or (is_reference(name) and resolves()):
        return

    def factory(spec: ModelSpec) -> nn.Module:
        raise CheckpointError(
            f"the checkpoint is of model {name!r}, built in Python from a model instance, so "
            "only its code can rebuild it: espn.load(run, model=...)"
        )

    factory.__doc__ = f"{name}: given to espn.wrap() as an instance (rebuilt by its code only)"
    MODELS.register(name)(factory)


def load(
    path: Path | str,
    model: nn.Module | Callable[..., nn.Module] | None = None,
    *,
    device: str = "cpu",
    progress: bool = False,
    benchmark_data: bool = False,
    trust_model_code: bool = False,
    **model_args: Any,
) -> ContinualLearner:
    """A learner holding every task of the run saved in ``path`` (by :meth:`ContinualLearner.
    save` or ``espn run``), ready to evaluate, export or learn more tasks with the run's
    method and settings.

    The model is rebuilt from the checkpoint's record, or from ``model`` (and ``model_args``)
    when only your code can build it (a model given to :func:`wrap` as an instance).
    Test data saved with the run is loaded with it; ``benchmark_data`` also builds the
    benchmark of an ``espn run`` run, so that its tasks evaluate without data given.
    A module the run names (an import reference) is imported only if it is already imported
    here or ``trust_model_code`` is set: opening a run directory never runs code it names.
    """
    from espn.models.reference import reading_run

    manifest = read_manifest(checkpoint_dir(path))
    name = str(manifest["model"])
    given = None
    if model is not None:
        with reading_run(path, trust_model_code):
            _known(name)
        spec = manifest["spec"]
        given = wrap(
            model,
            torch.zeros(2, *spec["input_shape"], device=device),
            multi_head=bool(spec["multi_head"]),
            task_affine=bool(manifest["config"].get("task_affine", False)),
            **model_args,
        )
    loaded = load_run(path, device, supernet=given, trust_code=trust_model_code)
    cfg = loaded.config
    sn = loaded.supernet
    sn.model_name = name
    strategy = METHODS.get(cfg.method)(cfg.method_config())
    learner = ContinualLearner(
        sn,
        strategy,
        optimizer=str(cfg.optimizer),
        lr=float(cfg.lr or 1e-3),
        batch_size=int(cfg.batch_size or 128),
        weight_decay=float(cfg.weight_decay or 0.0),
        momentum=float(cfg.momentum or 0.0),
        betas=cfg.betas or (0.9, 0.999),
        seed=cfg.seed,
        progress=progress,
    )
    tasks = loaded.checkpoint.tasks
    learner.names = [str(t.get("name") or f"task {i}") for i, t in enumerate(tasks)]
    learner.records = [dict(t.get("record") or learner.records[i]) for i, t in enumerate(tasks)]
    learner.rows = [None if t.get("accuracy") is None else list(t["accuracy"]) for t in tasks]
    if cfg.benchmark == "tensors" and cfg.data_dir is not None:
        for t in range(len(tasks)):
            file = task_path(cfg.data_dir, t)
            learner.tasks[t] = load_task(file, learner.device) if file.is_file() else None
    elif benchmark_data:
        seq = build_benchmark(cfg, download=False)  # a run directory's data_dir is only read
        learner.tasks = [seq.tasks[t] for t in range(len(tasks))]
    return learner


__all__ = ["ContinualLearner", "load", "wrap"]
