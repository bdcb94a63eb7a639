"""The one learner: :class:`ContinualLearner` is the only place where a sequence of tasks is
learned, for every front door: ``espn run``, ``espn.run``, sweeps and ``espn reproduce``
(a registered benchmark, assembled by :mod:`espn.experiment`), the Avalanche strategy, and a
Python user's own network and data.

Its settings are the training settings (:class:`~espn.settings.TrainingSettings`, one default
each) under the names of ``espn run``'s options (:data:`~espn.config.TRAINING_SETTINGS`),
resolved by the same precedence (:func:`espn.settings.layered`): what the user gave, then the
method's recipe, then a preset, then the recipe of the data's regime. Given a
directory (``out=``), it writes the run directory ``espn run`` writes, after every epoch, and
a second run of the same script resumes from it (see :mod:`espn.run_directory`).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
from torch import Tensor, nn

from espn import api_checks as checks
from espn.checkpoint.format import CheckpointError
from espn.config import (
    TRAINING_SETTINGS,
    RunConfig,
    check_applicable,
    check_names,
    make_config,
)
from espn.data.tasks import Split, Task, TaskSequence
from espn.data.tensors import (
    TaskData,
    identity,
    save_task,
    task_path,
    tensor_task,
)
from espn.errors import EspnError
from espn.export.export import ExportReport, check_target, export_task
from espn.learning import Learned, TaskRunner, task_record
from espn.loggers import make_loggers
from espn.methods.base import METHODS, Strategy, declared_options
from espn.models.reference import ModelReferenceError
from espn.models.registry import MODELS, ModelSpec
from espn.run_directory import DirectoryLock, RunDirectory
from espn.runs.checks import RunMismatch, check_out_dir, clear_run, run_meta
from espn.settings import METHOD_READS, explicit
from espn.supernet.supernet import Supernet
from espn.training.callbacks import Callback, CallbackList
from espn.training.distributed import join
from espn.training.engine import Engine
from espn.training.optim import OptimConfig
from espn.training.progress import ProgressBar

if TYPE_CHECKING:
    from espn.inference.export import AgnosticExportReport


class LearnerError(EspnError, ValueError):
    """A learner cannot do what was asked (no data to evaluate on, an unreachable budget,
    nothing to save, a run directory of other data); the message says why and what would
    work."""


#: where a Python run directory keeps the test data its accuracy matrix was computed on
DATA_DIR = "data"


def regime_of(supernet: Supernet) -> str:
    """The data regime whose recipe a network gets when none is named: ``cifar`` (the
    ResNet recipe) for a network with convolutions, ``mnist`` (the FC recipe) otherwise."""
    conv = any(layer.weight.dim() > 2 for layer in supernet.layers.values())
    return "cifar" if conv else "mnist"


def fingerprint(task: Task) -> str:
    """SHA-256 of a task's data (inputs and labels of both splits, as the engine sees them):
    what a resumed Python run checks that it is given the data it learned before."""
    digest = hashlib.sha256()
    for split in ("train", "test"):
        data = task.split(split)
        x, y = data.x[data.index], data.y
        for t in (x, y):
            digest.update(str((t.dtype, tuple(t.shape))).encode())
            digest.update(t.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


class Report(list[dict[str, Any]]):
    """Per task, a dict of facts (a list, as before); printed, a table."""

    COLUMNS = (
        ("task", "task", "{}"),
        ("name", "name", "{}"),
        ("classes", "n_classes", "{}"),
        ("FLOPs ratio", "flops_ratio", "{:.3f}"),
        ("weights used", "used_weights", "{:,}"),
        ("new weights", "new_weights", "{:,}"),
        ("units kept", "units_kept", "{:.3f}"),
    )

    def __str__(self) -> str:
        header = [c[0] for c in self.COLUMNS]
        rows = [[fmt.format(r[key]) for _, key, fmt in self.COLUMNS] for r in self]
        widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]

        def line(cells: list[str]) -> str:
            return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        return "\n".join([line(header), *(line(r) for r in rows)])


class ContinualLearner:
    """Learns tasks one after another into ``supernet`` with one method.

    ``method`` is a method name (``espn.methods.METHODS``), a :class:`Strategy` class, or a
    built strategy. ``settings`` are run options under the names ``espn run`` gives them
    (:data:`~espn.config.TRAINING_SETTINGS`: ``gamma``, ``alpha``, ``epochs``,
    ``optimizer``, ``lr``, ``batch_size``, ``seed``, ``amp``, ``eval_every``,
    ``reference_size``, ...) and the method's own options (``supsup_k``, ...). Those left out
    come from the method's recipe, then a ``preset``, then the recipe of ``recipe``: a
    benchmark's name or a data regime (``"mnist"``: FC networks on small images, ``"cifar"``:
    conv networks); by default the regime of the network (see :func:`regime_of`).

    ``out``: a run directory written after every epoch as ``espn run`` writes it; running
    the same script again resumes from it (``overwrite=True``: starts over, replacing the run
    there). While the learner lives (until :meth:`close`) no other process may write ``out``.
    ``callbacks`` (a list, see :mod:`espn.training.callbacks`) and ``loggers`` (callbacks,
    or logger names: ``"tensorboard"``, ``"csv"``, ``"wandb"`` or several comma-separated
    in one string, written under ``out/logs``; see :mod:`espn.loggers`) are told of every
    step, epoch and task (named loggers read the loss every ``log_every`` steps, default
    50); ``progress`` attaches a progress bar over each task's optimizer
    steps (the callback :class:`~espn.training.progress.ProgressBar`);
    ``device`` moves the supernet there (default: where it is).

    Started by ``torchrun``, the learner trains data-parallel over its processes (see
    :mod:`espn.training.distributed`; every rank runs the same script, rank 0 alone writes
    ``out``); ``distributed=False`` trains in each process alone.
    """

    #: the hold on :attr:`run_dir` (None: no ``out=``, or ``espn run``'s, which holds it)
    lock: DirectoryLock | None

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
        checks.check_learner(supernet, device, settings)
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
        setup = (supernet, strategy, cfg, progress, callbacks, loggers, log_every, distributed)
        ranks = join(distributed, next(supernet.parameters()).device)
        if out is None or (ranks is not None and not ranks.writer):  # rank 0 alone locks, writes
            self._setup(*setup)
            if out is not None:
                self._open(Path(out), resume=not overwrite)
            return
        lock = DirectoryLock(Path(out))
        weakref.finalize(self, lock.release)
        try:
            check_out_dir(out, resume=not overwrite, overwrite=overwrite, python=True)
            if overwrite:
                clear_run(out)
                for stale in (Path(out) / DATA_DIR).glob("task-*.safetensors"):
                    stale.unlink()
            self._setup(*setup)
            self.lock = lock
            self._open(Path(out), resume=not overwrite)
        except BaseException:
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
        learner._setup(
            supernet, strategy, cfg, progress, callbacks, loggers, log_every, distributed
        )
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
        distributed: bool = True,
    ) -> None:
        self.supernet, self.strategy, self.cfg = supernet, strategy, cfg
        #: the data-parallel ranks of a run under ``torchrun`` (None: this process alone)
        self.ranks = join(distributed, next(supernet.parameters()).device)
        if self.ranks is not None and self.ranks.device.type == "cuda":  # this rank's GPU
            supernet.to(self.ranks.device)
            supernet.owners.to(self.ranks.device)
        self.engine = Engine(
            supernet,
            strategy,
            cfg.optim_config(),
            cfg.batch_size,
            cfg.seed,
            amp=cfg.amp,
            reference_size=cfg.floor_reference(),
            compile=cfg.compile,
            slim_training=cfg.slim_training,
            task_agnostic=cfg.task_agnostic,
        )
        run_dir = None if cfg.out == Path(".") else Path(cfg.out)
        if self.ranks is not None and not self.ranks.writer:  # rank 0 reports and logs
            progress, loggers = False, ()
        bar = [ProgressBar()] if progress else []
        self.callbacks = CallbackList(
            [*callbacks, *make_loggers(list(loggers), run_dir, log_every=log_every), *bar]
        )
        self.engine.callbacks, self.engine.owner = self.callbacks, self
        self.engine.ranks = self.strategy.ranks = self.ranks
        self.device = next(supernet.parameters()).device
        #: per learned task: its data (None: not known here, e.g. a task loaded from a run)
        self.tasks: list[Task | None] = [None] * len(supernet.masks)
        self.names: list[str] = [f"task {t}" for t in range(len(supernet.masks))]
        #: learns and records every task (one accuracy row per step, None: not evaluated;
        #: one record per task)
        self.runner = TaskRunner(
            supernet,
            strategy,
            self.engine,
            [None] * len(supernet.masks),
            [task_record(supernet, t) for t in range(len(supernet.masks))],
        )
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
    def optim(self) -> OptimConfig:
        """The optimizer settings of the supernet's weights."""
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
        it (every ``eval_every``-th task): the task's row of :attr:`accuracy_matrix`.
        ``n_classes`` defaults to the largest label + 1. In a resumed run directory, a task
        learned before is checked against its data and not learned again.
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
        """Learn the tasks of ``seq`` (a registered benchmark's, see
        :func:`espn.runs.building.build_benchmark`) not learned yet: evaluated every
        ``eval_every``-th step and the last; the first task adopted from ``pretrained``
        weights when given; ``on_line`` receives a one-line summary per step."""
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
        """Learn ``steps`` (step ``offset + k`` commits the next task(s) of ``known``, the
        tasks after those this learner holds, or all tasks by index when ``offset`` is 0 and
        ``keep_data`` False); steps already learned (a resumed run) are skipped."""
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
                    self._check_resumed(i, step, known, base)
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
        """Keep the tasks the supernet holds now as learned (a task over budget too: it is
        recorded), with their data when ``keep_data``."""
        for t in range(len(self.tasks), len(self.supernet.masks)):
            task = by_index[t]
            self.tasks.append(task if keep_data else None)
            self.names.append(task.name if task is not None else f"task {t}")
        self.replayed = max(self.replayed, len(self.supernet.masks))

    def close(self) -> None:
        """The end of learning: callbacks' ``on_run_end`` (loggers flush and close), and the
        run directory's lock released (learning again takes it again)."""
        if self._started:
            self._started = False
            self.callbacks.on_run_end(self)
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> ContinualLearner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        first = self.replayed if self.replayed < len(self.supernet.masks) else len(self.tasks)
        for t, (train, test) in enumerate(data):
            name = (names[t] if names is not None else None) or f"task {first + t}"
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

    def _record(self, task: int) -> dict[str, Any]:
        return task_record(self.supernet, task)

    # ------------------------------------------------------------- run directory
    def _open(self, out: Path, resume: bool) -> None:
        """Write the run directory ``out`` from now on, resuming the run it holds (unless
        not ``resume``: a new run over it, ``overwrite=True``)."""
        rd = RunDirectory(self._saved_config(out), self._sequence, meta=self._meta)
        rd.extra = lambda: {"fingerprints": list(self.fingerprints)}
        try:
            ckpt = rd.open(self.supernet, self.engine, self.strategy, resume, ignore=("tasks",))
        except RunMismatch as exc:
            raise LearnerError(
                f"cannot resume {exc.where}: it was made with other settings "
                f"({'; '.join(exc.diffs)}); give the learner the same method and settings to "
                "resume it, overwrite=True to start over and replace it, or another out="
            ) from None
        self.attach(rd)
        n = len(self.supernet.masks)
        manifest = ckpt.manifest or {}
        self.fingerprints = [str(f) for f in manifest.get("fingerprints", [])]
        entries = manifest.get("tasks", [])
        self.rows, self.records = ckpt.rows, ckpt.per_task
        self.names = [str(e.get("name") or f"task {t}") for t, e in enumerate(entries)]
        self.tasks = [None] * n
        self.replayed = 0
        if ckpt.summary:
            self.summary = ckpt.summary

    def attach(self, rd: RunDirectory) -> None:
        """Write the run directory ``rd`` (opened on this learner's parts) from now on: a
        callback that checkpoints epochs' ends (:func:`~espn.run_directory.checkpoint_due`);
        the learner writes it after every step."""
        self.run_dir = rd
        self.callbacks.append(rd)

    def _replay(self, tasks: list[Task]) -> list[dict[str, Any]]:
        """Tasks a resumed script gives again: checked against the data they were learned
        from (refused if it differs), kept for evaluation, not learned again."""
        first = self.replayed
        for k, task in enumerate(tasks):
            t = first + k
            self._check_print(t, task)
            held = {"n_classes": self.supernet.masks[t].n_classes, "name": self.names[t]}
            for key, now in (("n_classes", task.n_classes), ("name", task.name)):
                if now != held[key]:
                    raise LearnerError(
                        f"{self.cfg.out}: task {t} was learned there with {key}="
                        f"{held[key]!r}, given {key}={now!r} now; give it as it was to "
                        "resume the run, or pass another out= to start a new one"
                    )
            self.tasks[t] = task
        self.replayed = first + len(tasks)
        return self.records[first : first + len(tasks)]

    def _check_resumed(self, i: int, step: Task, known: Sequence[Task | None], base: int) -> None:
        """Before learning step ``i`` into the run directory: the task in training there (a
        script killed mid-task) must be given the same data; note the new task's print."""
        tasks = [t for t in known if t is not None]
        prints = [fingerprint(t) for t in tasks]
        for k, (task, print_) in enumerate(zip(tasks, prints, strict=True)):
            if base + k < len(self.fingerprints):
                self._check_print(base + k, task, print_)
        self.fingerprints = self.fingerprints[:base] + prints

    def _check_print(self, index: int, task: Task, print_: str | None = None) -> None:
        saved = self.fingerprints[index] if index < len(self.fingerprints) else None
        if saved is not None and saved != (print_ or fingerprint(task)):
            raise LearnerError(
                f"{self.cfg.out}: task {index} was learned there from other data than given "
                f"now ({task.name!r}); give the tasks it holds the same data in the same order "
                "to resume it, or pass another out= to start a new run"
            )

    def _write(self, rd: RunDirectory) -> None:
        """After a step: the tasks' test data, then the checkpoint, then results.json and
        the plot (the run directory of ``espn run``, read by ``espn evaluate/show``)."""
        if self.run_dir is rd and rd.meta is not None and rd.writes:  # its data beside it
            rd.cfg = self._saved_config(Path(rd.out))
            self._save_data(Path(rd.out))
        rd.step_done(self.supernet, self.rows, self.records)
        rd.plot()

    def _save_data(self, path: Path) -> None:
        """Each learned task's test data in ``path/data`` (what evaluate re-computes on)."""
        for t, task in enumerate(self.tasks):
            file = task_path(path / DATA_DIR, t)
            if task is not None and len(task.test) and not file.exists():
                save_task(file, task, splits=("test",))

    def _saved_config(self, out: Path) -> RunConfig:
        """This learner's configuration as a run directory records it (benchmark
        ``tensors``: the test data saved beside it, one file per task learned)."""
        return self.cfg.model_copy(update={"out": out, "tasks": max(len(self.supernet.masks), 1)})

    def _meta(self, cfg: RunConfig | None = None) -> dict[str, Any]:
        """What the checkpoint records about the run (its configuration, model spec)."""
        seq = self._sequence()
        meta = run_meta(cfg or self._saved_config(Path(self.cfg.out)), seq)
        width = self.supernet.model_classes  # the head a registered model was built with
        classes = [m.n_classes for m in self.supernet.masks] + [width or 1]
        meta["spec"]["n_classes"] = max(classes)
        meta["n_tasks"] = max(len(seq), 1)  # as ``tasks`` is: task 0 in training counts
        return meta

    # ---------------------------------------------------------------- evaluation
    @property
    def accuracy_matrix(self) -> list[list[float] | None]:
        """Row ``i``: accuracy (%) of tasks ``0..i`` after task ``i`` was learned (None where
        some task had no test data, or ``eval_every`` skipped it)."""
        return [None if r is None else list(r) for r in self.rows]

    @overload
    def evaluate(
        self,
        task: int,
        data: TaskData | None = None,
        *,
        task_agnostic: Literal[False] = False,
        rule: None = None,
    ) -> float: ...

    @overload
    def evaluate(
        self,
        task: Sequence[TaskData] | None = None,
        data: None = None,
        *,
        task_agnostic: Literal[True],
        rule: str | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]: ...

    def evaluate(
        self,
        task: int | Sequence[TaskData] | None = None,
        data: TaskData | None = None,
        *,
        task_agnostic: bool = False,
        rule: str | None = None,
    ) -> float | dict[str, Any] | list[dict[str, Any]]:
        """Accuracy (%) of task ``task``'s sub-network on ``data`` (default: its test data).

        With ``task_agnostic=True``, prediction without the task instead, by ``rule`` (see
        :mod:`espn.inference`): ``task`` is one ``(x, y)`` test set per learned task, in
        order (default: each task's test data here); the figures of
        :func:`espn.inference.evaluate_task_agnostic` (per task: accuracy with the task
        given, without it per sample and per batch, how often the task is picked right);
        ``rule="all"``: a list of them, one per rule the run can use."""
        checks.check_bool(task_agnostic, "task_agnostic")
        if task_agnostic:
            if data is not None:
                raise checks.fail(
                    "data",
                    "is one task's; with task_agnostic=True give one (x, y) per learned task "
                    "as the first argument",
                )
            from espn.inference import evaluate_named, evaluate_task_agnostic

            if isinstance(task, int):
                raise checks.fail("tasks", "with task_agnostic=True: one (x, y) per learned task")
            tasks = self._every_task(task, "tasks")
            if rule == "all":  # one document per rule the run can use
                return evaluate_named(self.supernet, tasks, "all")
            return evaluate_task_agnostic(self.supernet, tasks, rule)
        if rule is not None:
            raise checks.fail("rule", "picks the task without it; add task_agnostic=True")
        if not isinstance(task, int):
            raise checks.fail("task", f"must be a task index (int), got {task!r}")
        self._check_task(task)
        if data is None:
            known = self.tasks[task]
            if known is None or not len(known.test):
                raise LearnerError(f"task {task} has no test data here; pass data=(x, y)")
            return self.runner.evaluator.accuracy(known, task)
        return self.runner.evaluator.accuracy(self._probe(task, data, "data"), task)

    def _probe(self, task: int, data: TaskData, argument: str) -> Task:
        """``data`` as test data of learned task ``task``, checked."""
        n_classes = self.supernet.masks[task].n_classes
        with checks.about(argument):
            probe = tensor_task(self.names[task], None, data, n_classes, self.device)
        checks.check_inputs(probe.test.x, argument, self.supernet.input_shape)
        return probe

    def _every_task(self, given: Sequence[TaskData] | None, argument: str) -> list[Task]:
        """One test set per learned task: ``given`` (``(x, y)`` each, in task order), else
        each task's test data here."""
        n = len(self.supernet.masks)
        if not n:
            raise LearnerError("no task is learned yet")
        if given is None:
            missing = [t for t, k in enumerate(self.tasks) if k is None or not len(k.test)]
            if missing:
                raise LearnerError(
                    f"tasks {missing} have no test data here; pass {argument}=[(x, y), ...], "
                    "one per learned task"
                )
            return [k for k in self.tasks if k is not None]
        if isinstance(given, tuple | Tensor) or not isinstance(given, Sequence) or len(given) != n:
            raise checks.fail(
                argument,
                f"give a list of {n} (x, y) test sets, one per learned task in order",
            )
        return [self._probe(t, data, f"{argument}[{t}]") for t, data in enumerate(given)]

    def _check_task(self, task: int) -> None:
        checks.check_task(task, len(self.supernet.masks))

    def report(self) -> Report:
        """Per task: name, classes, FLOPs (and ratio to the dense supernet), weights used and
        new weights owned, units kept; counted from the supernet as it is now. A list of
        dicts that prints as a table."""
        return Report(
            {"task": t, "name": self.names[t], "n_classes": self.supernet.masks[t].n_classes}
            | self._record(t)
            for t in range(len(self.supernet.masks))
        )

    def export(
        self,
        task: int,
        path: Path | str,
        data: TaskData | None = None,
        onnx: bool | None = None,
        fold_bn: bool = True,
        overwrite: bool = False,
    ) -> ExportReport:
        """Write task ``task`` as a slim standalone model (``.pt2`` or ``.onnx``), checked
        against the supernet on ``data``'s inputs (default: the task's test, else training
        data) and against the task's FLOPs (see :func:`espn.export.export.export_task`);
        ``onnx``: with a ``.pt2`` path, also write the ``.onnx`` beside it (default: when the
        onnx packages are installed, as ``espn export`` does; ``True`` without them says so).
        Existing files (the model, its ``.onnx`` and ``.json``) are replaced only with
        ``overwrite``, and a run directory's own files never."""
        self._check_task(task)
        checks.check_export_path(path)
        check_target(path)
        known: Task | None = None
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
        if onnx and Path(path).suffix == ".pt2":
            from espn.export.export import ExportError, onnx_available

            if not onnx_available():
                raise ExportError(
                    "onnx=True needs the onnx and onnxscript packages: pip install espn[onnx]"
                )
        flops = self._record(task)["flops"]
        if data is None and known is not None:  # raw inputs in: the task's transform too
            raw = known.raw_inputs("test" if len(known.test) else "train", 1024)
            return export_task(
                self.supernet, task, raw, path, onnx, flops, fold_bn, known.transform, overwrite
            )
        inputs = list(x.split(1024))
        return export_task(
            self.supernet, task, inputs, path, onnx, flops, fold_bn, overwrite=overwrite
        )

    def export_task_agnostic(
        self,
        path: Path | str,
        data: Sequence[TaskData] | None = None,
        rule: str | None = None,
        onnx: bool | None = None,
        fold_bn: bool = True,
        overwrite: bool = False,
    ) -> AgnosticExportReport:
        """Write one standalone model that predicts without the task (``.pt2``, or
        ``.onnx``): every task's slim sub-network and ``rule`` (see
        :func:`espn.inference.export.export_task_agnostic`), returning ``(classes, tasks)``
        for a batch of model inputs; checked against :meth:`predict` on up to 1024 inputs
        of each task's ``data`` (one ``(x, y)`` or inputs per learned task; default: each
        task's test data here). ``onnx`` and ``overwrite`` as in :meth:`export`."""
        from espn.export.export import check_not_replacing, export_files
        from espn.inference.export import export_task_agnostic

        checks.check_export_path(path)
        check_target(path)
        check_not_replacing(export_files(path, onnx), overwrite)
        tasks = self._every_task(data, "data")
        inputs = [next(task.batches("test", 1024))[0] for task in tasks]
        return export_task_agnostic(self.supernet, inputs, path, rule, onnx, fold_bn)

    # ------------------------------------------------------------------ saving
    def config(self, out: Path | str) -> RunConfig:
        """The run configuration a checkpoint records for this learner (benchmark
        ``tensors``: the test data saved beside it)."""
        return self._saved_config(Path(out))

    def save(self, path: Path | str, overwrite: bool = False) -> Path:
        """Save every learned task as ``espn run`` does: ``path/checkpoint`` (safetensors +
        JSON), ``path/results.json``, ``path/accuracy.png``, and the tasks' test data in
        ``path/data`` (so that ``espn evaluate --run path`` re-computes the accuracies).
        Refuses a directory holding another run unless ``overwrite``."""
        path = checks.check_save_path(path)
        if not self.supernet.masks:
            raise LearnerError("nothing to save: no task is learned yet")
        if self.ranks is not None and not self.ranks.writer:  # rank 0 saves the run
            return path
        check_out_dir(path, resume=False, overwrite=overwrite, python=True)
        for stale in (path / DATA_DIR).glob("task-*.safetensors"):  # of an overwritten run
            stale.unlink()
        for name in ("results.json", "accuracy.png"):
            (path / name).unlink(missing_ok=True)
        self._save_data(path)
        cfg = self._saved_config(path)
        rd = RunDirectory(cfg, self._sequence, meta=lambda: self._meta(cfg))
        rd.extra = lambda: {"saved_by": "api", "fingerprints": list(self.fingerprints)}
        rd.open(self.supernet, self.engine, self.strategy, False)
        rd.step_done(self.supernet, self.rows, self.records)
        rd.plot()
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
    def infer_task(
        self, x: torch.Tensor, same_task: bool = False, rule: str | None = None
    ) -> torch.Tensor:
        """The task of each sample of ``x`` (a batch of inputs), inferred by ``rule`` (see
        :mod:`espn.inference`; default ``espn.inference.DEFAULT_RULE``); with ``same_task``,
        one task for the whole batch (the samples' scores summed)."""
        from espn.inference import infer

        checks.check_bool(same_task, "same_task")
        return infer(self.supernet, self._inputs(x), rule, same_task).tasks

    def predict(
        self,
        x: torch.Tensor,
        task: int | None = None,
        same_task: bool = False,
        rule: str | None = None,
    ) -> torch.Tensor:
        """Class predicted for each sample of ``x`` by task ``task``'s sub-network or, with
        ``task=None``, by the sub-network of the task inferred for it (:meth:`infer_task`):
        where the inferred task is ``t`` the prediction equals ``predict(x, task=t)``."""
        from espn.inference import infer, predict_given

        checks.check_bool(same_task, "same_task")
        x = self._inputs(x)
        if task is not None:
            self._check_task(task)
            for name, value in (("rule", rule), ("same_task", same_task or None)):
                if value is not None:
                    raise checks.fail(
                        name,
                        f"{value!r} infers the task, and task={task} is given; give one of them",
                    )
            return predict_given(self.supernet, x, task)
        return infer(self.supernet, x, rule, same_task).classes

    def _inputs(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` checked as a batch of model inputs, on the learner's device."""
        checks.check_inputs(x, "x", self.supernet.input_shape)
        return x.to(self.device)


def task_line(learned: Learned, records: list[dict[str, Any]], n_tasks: int, name: str) -> str:
    """The one-line summary of a learned step (the mean accuracy of MTL's tasks)."""
    tasks, row = learned.tasks, learned.row
    acc = "-" if row is None else f"{sum(row[tasks.start :]) / len(tasks):.2f}%"
    new = sum(r["new_weights"] for r in records[tasks.start :])
    last = records[-1]
    which = f"task {tasks.start}" if len(tasks) == 1 else f"tasks {tasks.start}..{tasks.stop - 1}"
    return (
        f"{which} ({tasks.stop}/{n_tasks} done) {name}: acc {acc}  "
        f"FLOPs {last['flops_ratio']:.3f}  "
        f"new weights {new}/{last['weight_budget']}  ({learned.log.seconds:.1f}s)"
    )


def _configure(
    supernet: Supernet,
    method: str | type[Strategy] | Strategy,
    recipe: str | None,
    settings: dict[str, Any],
    out: Path | str | None,
) -> tuple[Strategy, RunConfig]:
    """The learner's strategy and its resolved run configuration (benchmark ``tensors``)."""
    built = method if isinstance(method, Strategy) else None
    if built is not None:
        cls: type[Strategy] = type(built)
    elif isinstance(method, str):
        cls = METHODS.get(method)
    elif isinstance(method, type) and issubclass(method, Strategy):
        cls = method
    else:
        raise TypeError(
            f"method must be a method name ({', '.join(METHODS.names())}), a Strategy class or "
            f"a built strategy, got {method!r}"
        )
    try:
        check_names(cls, settings)
    except ValueError as exc:
        raise checks.fail("settings", str(exc)) from None
    foreign = set(declared_options())
    values = dict(settings)
    if built is not None:
        fixed = built.given if built.given is not None else _hand_built(built)
        mine = {*fixed, *foreign, *cls.option_names()}
        own = sorted(k for k in values if k in mine)
        if own:
            raise TypeError(f"settings {own} given with a built strategy")
        if built.given is not None:  # from create_method: what was given there counts
            values |= built.given
            recipe = values.pop("recipe", None) or recipe
        else:
            values |= _hand_built(built) | dict(built.cfg.method_options)
    _record_streams(cls, supernet, values)
    name = model_name(supernet)
    device = str(next(supernet.parameters()).device)
    fields = {
        "benchmark": "tensors",
        "data_dir": Path(DATA_DIR),
        "method": cls.name,
        "model": name,
        "recipe": recipe or regime_of(supernet),
        "device": device,
        "out": Path(out) if out is not None else Path("."),
    }
    cfg = make_config(cls, **fields, **values)
    given = {k: v for k, v in settings.items() if k != "stream_pruning"}
    if built is not None and built.given is not None:
        given |= {k: v for k, v in built.given.items() if k != "stream_pruning"}
    check_applicable(given, cfg)  # options that would be ignored are refused
    if built is not None and built.given is None:
        return built, cfg
    return cls(cfg.method_config()), cfg


def _hand_built(strategy: Strategy) -> dict[str, Any]:
    """The settings a strategy built by hand from :class:`~espn.settings.TrainingSettings`
    fixes: those it reads itself (its budgets only where it has them), as it holds them, and
    any other it sets apart from the defaults; the rest follow the precedence."""
    cfg, cls = strategy.cfg, type(strategy)
    unused = {"gamma"} if not cls.uses_gamma else set()
    unused |= {"alpha"} if not cls.uses_alpha else set()
    reads = {n: getattr(cfg, n) for n in METHOD_READS if n not in unused}
    values = explicit(cfg) | {k: v for k, v in reads.items() if v is not None}
    return {k: v for k, v in values.items() if k in TRAINING_SETTINGS}


def _record_streams(cls: type[Strategy], supernet: Supernet, values: dict[str, Any]) -> None:
    """The residual streams are built with the model (``wrap``): a method's ``stream_pruning``
    records how they were, and one given that differs is refused."""
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


def model_name(supernet: Supernet) -> str:
    """The name a run configuration gives the supernet's model (registered where only the
    caller's code can rebuild it, see :func:`known_model`)."""
    name = supernet.model_name
    if name is None:
        model = supernet.model
        name = f"<{type(model).__module__}.{type(model).__qualname__} instance>"
    known_model(name)
    return name


def known_model(name: str) -> None:
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


__all__ = ["ContinualLearner", "LearnerError", "Report", "fingerprint", "regime_of"]
