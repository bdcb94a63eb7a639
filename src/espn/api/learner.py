"""The one learner: :class:`ContinualLearner` is the only place where a sequence of tasks is
learned, for every front door (``espn run``, ``espn.run``, sweeps, ``espn reproduce``, the
Avalanche strategy, a Python user's own network and data); see docs/python.md."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from espn.api import checks
from espn.api.checks import LearnerError
from espn.api.run_directory import DATA_DIR, LearnerRuns
from espn.api.tasks import Report, TaskRunner, task_line
from espn.data.tasks import Task, TaskSequence
from espn.data.tensors import TaskData
from espn.methods.base import METHODS, Strategy, declared_options
from espn.runs.config import ConfigError, RunConfig, given_names, make_config
from espn.runs.given import TRAINING_SETTINGS, check_applicable, check_names
from espn.runs.loading import model_name
from espn.runs.method import method_class
from espn.runs.resuming import RunDirectory
from espn.settings.training import METHOD_READS, OptimizerSettings, explicit
from espn.supernet.supernet import Supernet
from espn.training.callbacks import Callback, CallbackList
from espn.training.distributed import Ranks, join, shard_count
from espn.training.engine import Engine
from espn.training.loggers import make_loggers
from espn.training.progress import ProgressBar


def regime_of(supernet: Supernet) -> str:
    """The data regime whose recipe a network gets when none is named: ``cifar`` (the
    ResNet recipe) for a network with convolutions, ``mnist`` (the FC recipe) otherwise."""
    conv = any(layer.weight.dim() > 2 for layer in supernet.layers.values())
    return "cifar" if conv else "mnist"


class ContinualLearner(LearnerRuns):
    """Learns tasks one after another into ``supernet`` with one method (a name, a
    :class:`Strategy` class or a built strategy); see docs/python.md.

    ``settings``: the training settings under ``espn run``'s names
    (:data:`~espn.runs.given.TRAINING_SETTINGS`) and the method's own options; those left out
    come from the method's recipe, a ``preset``, then ``recipe`` (a benchmark or a data regime;
    default :func:`regime_of` the network). ``out``: a run directory written as ``espn run``
    writes it and resumed by running the script again (``overwrite=True``: started over), held
    against other processes until :meth:`close`. ``callbacks`` and ``loggers`` (callbacks or
    logger names, reading the loss every ``log_every`` steps) are told of every step, epoch and
    task; ``progress`` adds a progress bar; ``device`` moves the supernet there. Under
    ``torchrun`` it trains data-parallel (rank 0 writes ``out``) unless not ``distributed``.
    """

    def __init__(
        self,
        supernet: Supernet,
        method: str | type[Strategy] | Strategy = "espn",
        *,
        out: Path | str | None = None,
        overwrite: bool = False,
        recipe: str | None = None,
        callbacks: Iterable[Callback] = (),
        loggers: str | Iterable[Callback | str] = (),
        log_every: int | None = None,
        progress: bool = False,
        device: str | torch.device | None = None,
        distributed: bool = True,
        **settings: Any,
    ) -> None:
        checks.check_learner(supernet, device)
        callbacks = checks.check_callbacks(callbacks)
        loggers = checks.check_loggers(loggers, log_every)
        checks.check_bool(overwrite, "overwrite")
        if overwrite and out is None:
            raise checks.fail("overwrite", "replaces the run in out=, and no out= is given")
        if device is not None:
            supernet.to(device)
            supernet.owners.to(device)
        if out is not None:
            out = checks.check_save_path(out)
        with checks.about("settings"):
            strategy, cfg = _configure(supernet, method, recipe, settings, out)
        ranks = join(distributed, next(supernet.parameters()).device)
        writes = ranks is None or ranks.writer  # rank 0 alone locks and writes
        lock = self._claim(out, overwrite) if out is not None and writes else None
        try:
            self._setup(supernet, strategy, cfg, progress, callbacks, loggers, log_every, ranks)
            self.lock = lock
            if out is not None:
                self._open(out, resume=not overwrite)
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    @classmethod
    def from_config(
        cls,
        supernet: Supernet,
        cfg: RunConfig,
        *,
        progress: bool = False,
        callbacks: Iterable[Callback] = (),
        loggers: Iterable[Callback | str] = (),
        log_every: int | None = None,
        distributed: bool = True,
    ) -> ContinualLearner:
        """The learner of a resolved run configuration (``espn run``'s door)."""
        learner = cls.__new__(cls)
        strategy = METHODS.get(cfg.method)(cfg.method_config())
        ranks = join(distributed, next(supernet.parameters()).device)
        learner._setup(supernet, strategy, cfg, progress, callbacks, loggers, log_every, ranks)
        return learner

    def _setup(
        self,
        supernet: Supernet,
        strategy: Strategy,
        cfg: RunConfig,
        progress: bool,
        callbacks: Iterable[Callback],
        loggers: Iterable[Callback | str],
        log_every: int | None,
        ranks: Ranks | None,
    ) -> None:
        self.supernet, self.strategy, self.cfg = supernet, strategy, cfg
        #: the data-parallel ranks of a run under ``torchrun`` (None: this process alone)
        self.ranks = ranks
        shard_count(cfg.shards, self.ranks)  # refuses fewer slices than ranks, up front
        if self.ranks is not None and self.ranks.device.type == "cuda":  # this rank's GPU
            supernet.to(self.ranks.device)
            supernet.owners.to(self.ranks.device)
        self.engine = Engine.of(supernet, strategy, cfg.training_settings())
        if self.ranks is not None and not self.ranks.writer:  # rank 0 reports and logs
            progress, loggers = False, ()
        bar = [ProgressBar()] if progress else []
        self.callbacks = CallbackList(
            [*callbacks, *make_loggers(list(loggers), self._run(), log_every=log_every), *bar]
        )
        self.engine.callbacks, self.engine.owner = self.callbacks, self
        self.engine.ranks = self.strategy.ranks = self.ranks
        self.device = next(supernet.parameters()).device
        #: per learned task: its data (None: not known here, e.g. a task loaded from a run)
        self.tasks: list[Task | None] = [None] * len(supernet.masks)
        self.names: list[str] = [f"task {t}" for t in range(len(supernet.masks))]
        #: learns and records every task (one accuracy row per step, None: not evaluated;
        #: one record per task)
        self.runner = TaskRunner(supernet, strategy, self.engine)
        self.runner.evaluator.ranks = self.ranks
        self.run_dir: RunDirectory | None = None
        #: fingerprints of the tasks learned (and the one in training) in :attr:`run_dir`
        self.fingerprints: list[str] = []
        #: tasks a resumed script has given again so far (checked, not learned again)
        self.replayed = len(supernet.masks)
        #: how a resumed run directory was found ("" if not resumed)
        self.summary = ""
        self._started = False
        self.lock = None

    # ------------------------------------------------------------------ settings
    @property
    def optim(self) -> OptimizerSettings:
        """The optimizer settings of the supernet's weights (the run's training settings)."""
        return self.engine.optim

    @property
    def seed(self) -> int:
        return self.cfg.seed

    @property
    def batch_size(self) -> int:
        return self.engine.batch_size

    @property
    def rows(self) -> list[list[float] | None]:
        """One accuracy row per learning step (see :attr:`accuracy_matrix`)."""
        return self.runner.rows

    @property
    def records(self) -> list[dict[str, Any]]:
        """One record per learned task: FLOPs, weights, budget, time, data sizes."""
        return self.runner.records

    # ------------------------------------------------------------------ learning
    def learn(
        self,
        data: TaskData,
        test: TaskData | None = None,
        *,
        n_classes: int | None = None,
        name: str | None = None,
    ) -> dict[str, Any]:
        """Learn one task from ``data`` (``(x, y)`` tensors or an iterable of batches) and
        return its record; with ``test`` data the tasks learned so far are evaluated after it
        (every ``eval_every``-th task). ``n_classes`` defaults to the largest label + 1. In a
        resumed run directory, a task learned before is checked against its data, not
        learned again."""
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
        if self.replayed < len(self.supernet.masks):
            return self._replay([task])[0]
        self.runner.check_gamma_reachable(self.supernet.model_name)
        self._learn_steps([task], [task], offset=len(self.rows))
        return self.records[-1]

    def learn_all(
        self,
        tasks: Sequence[tuple[TaskData, TaskData | None]],
        *,
        n_classes: Sequence[int | None] | None = None,
        names: Sequence[str | None] | None = None,
    ) -> list[dict[str, Any]]:
        """Learn several ``(train, test)`` tasks as :meth:`learn` does, or all together for a
        method that trains them jointly (MTL: one accuracy row); their records, in order."""
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
        given = self._tasks(tasks, n_classes, names)
        if self.replayed < len(self.supernet.masks):
            return self._replay(given)
        if self.supernet.masks:
            raise LearnerError(
                f"method {self.strategy.name!r} learns all its tasks in one call; this learner "
                f"already holds {len(self.supernet.masks)} task(s)"
            )
        self.runner.check_gamma_reachable(self.supernet.model_name)
        seq = TaskSequence("tensors", given, tuple(self.supernet.input_shape), self._multi_head())
        self._learn_steps(self.strategy.training_tasks(seq), given, last=0)
        return list(self.records)

    def learn_sequence(
        self,
        seq: TaskSequence,
        *,
        pretrained: dict[str, torch.Tensor] | None = None,
        on_line: Any = None,
    ) -> None:
        """Learn the tasks of a benchmark's ``seq`` not learned yet (evaluated every
        ``eval_every``-th step and the last; the first adopted from ``pretrained`` weights when
        given); ``on_line`` receives a one-line summary per step."""
        steps = self.strategy.training_tasks(seq)
        self._learn_steps(
            steps,
            seq.tasks,
            last=len(steps) - 1,
            keep_data=False,
            pretrained=pretrained,
            on_line=on_line,
            n_tasks=len(seq),
        )

    def _learn_steps(
        self,
        steps: Sequence[Task],
        known: Sequence[Task | None],
        *,
        offset: int = 0,
        last: int | None = None,
        keep_data: bool = True,
        pretrained: dict[str, torch.Tensor] | None = None,
        on_line: Any = None,
        n_tasks: int | None = None,
    ) -> None:
        """Learn ``steps`` (step ``offset + k`` commits the next task(s) of ``known``; by index
        for a benchmark, ``keep_data`` False), skipping those a resumed run learned."""
        if self.lock is not None:
            self.lock.check()
        if not self._started:
            self._started = True
            self.callbacks.on_run_start(self)
        rd = self.run_dir
        base = 0 if not keep_data else len(self.tasks)
        # a benchmark's tasks stay lazy (built on use, the latest kept): never a list of them
        by_index = known if not keep_data else [*self.tasks, *known]
        try:
            for k, step in enumerate(steps):
                i = offset + k
                if i < len(self.rows):
                    continue
                if rd is not None and keep_data:
                    self._check_resumed(known, base)
                learned = self.runner.learn(
                    step,
                    i,
                    by_index,
                    evaluate=(i + 1) % self.cfg.eval_every == 0 or i == last,
                    pretrained=pretrained if i == 0 else None,
                    resume=None if rd is None else rd.resume_point(i),
                )
                self._commit(by_index, keep_data)
                if rd is not None:
                    self._write(rd)
                if on_line is not None:
                    n = n_tasks or len(self.supernet.masks)
                    on_line(task_line(learned, self.records, n, step.name))
        finally:
            self._commit(by_index, keep_data)

    def _commit(self, by_index: Sequence[Task | None], keep_data: bool) -> None:
        """Keep the tasks the supernet holds now (over budget too), their data if ``keep_data``."""
        for t in range(len(self.tasks), len(self.supernet.masks)):
            task = by_index[t]
            self.tasks.append(task if keep_data else None)
            self.names.append(task.name if task is not None else f"task {t}")
        self.replayed = max(self.replayed, len(self.supernet.masks))

    def _joint(self) -> bool:
        """Whether the method trains every task at once (MTL), not one at a time."""
        return type(self.strategy).training_tasks is not Strategy.training_tasks


def _configure(
    supernet: Supernet,
    method: str | type[Strategy] | Strategy,
    recipe: str | None,
    settings: dict[str, Any],
    out: Path | str | None,
) -> tuple[Strategy, RunConfig]:
    """The learner's strategy and its resolved run configuration (benchmark ``tensors``)."""
    built = method if isinstance(method, Strategy) else None
    cls = (
        type(built)
        if built is not None
        else method_class(method, "method must be", ", a Strategy class or a built strategy")
    )
    try:
        check_names(cls, settings.keys())
    except ValueError as exc:
        raise checks.fail("settings", str(exc)) from None
    values = dict(settings)
    if built is not None:
        fixed = built.given if built.given is not None else _hand_built(built)
        mine = {*fixed, *declared_options(), *cls.option_names()}
        own = sorted(k for k in values if k in mine)
        if own:
            raise TypeError(f"settings {own} given with a built strategy")
        if built.given is not None:  # from create_method: what was given there counts
            values |= built.given
            recipe = values.pop("recipe", None) or recipe
        else:
            values |= fixed | dict(built.cfg.method_options)
    _record_streams(cls, supernet, values)
    fields = {
        "benchmark": "tensors",
        "data_dir": Path(DATA_DIR),
        "method": cls.name,
        "model": model_name(supernet),
        "recipe": recipe or regime_of(supernet),
        "device": str(next(supernet.parameters()).device),
        "out": Path(out) if out is not None else Path("."),
    }
    try:
        cfg = make_config(cls, **fields, **values)
    except ConfigError as exc:  # a setting's refusal, in the Python API's terms
        raise checks.ApiArgumentError(str(exc)) from None
    given = settings | (built.given if built is not None and built.given is not None else {})
    # options that would be ignored are refused
    check_applicable(given_names(given) - {"stream_pruning"}, cfg)
    if built is not None and built.given is None:
        return built, cfg
    return cls(cfg.method_config()), cfg


def _hand_built(strategy: Strategy) -> dict[str, Any]:
    """The settings a strategy built by hand fixes: those it reads (its budgets where it has
    them) and any other it sets apart from the defaults; the rest follow the precedence."""
    cfg, cls = strategy.cfg, type(strategy)
    unused = {"gamma"} if not cls.uses_gamma else set()
    unused |= {"alpha"} if not cls.uses_alpha else set()
    reads = {n: getattr(cfg, n) for n in METHOD_READS if n not in unused}
    values = explicit(cfg) | {k: v for k, v in reads.items() if v is not None}
    return {k: v for k, v in values.items() if k in TRAINING_SETTINGS}


def _record_streams(cls: type[Strategy], supernet: Supernet, values: dict[str, Any]) -> None:
    """Refuse a ``stream_pruning`` other than the one ``wrap`` built."""
    built = supernet.stream_pruning
    asked = values.get("stream_pruning")
    if asked is not None and built is None:
        raise checks.ApiArgumentError(
            f"stream_pruning={asked!r}, but the supernet has no residual stream for it to "
            "prune; leave it unset"
        )
    if "stream_pruning" not in cls.option_names() or built is None:
        return
    if asked is not None and asked != built:
        raise checks.ApiArgumentError(
            f"stream_pruning={asked!r}, but the supernet's residual streams are {built}: they "
            f"are built with the model, by espn.wrap(..., stream_pruning={asked!r})"
        )
    values["stream_pruning"] = built


__all__ = ["ContinualLearner", "LearnerError", "Report", "regime_of"]
