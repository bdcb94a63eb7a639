"""The one place where a task is learned and recorded (:class:`TaskRunner`), and where the
tasks a learner holds are used (:class:`LearnedTasks`: evaluated, predicted, reported, exported).

A *step* is what a method trains at once: one task for a sequential method, every task for
MTL; the runner keeps one accuracy row per step and one record per committed task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
from torch import Tensor

from espn.api import checks
from espn.api.checks import LearnerError
from espn.data.tasks import Task
from espn.data.tensors import TaskData, tensor_task
from espn.evaluation.metrics import task_record
from espn.evaluation.slim_eval import SlimEvaluator
from espn.export.export import ExportReport, check_target, export_task
from espn.inference import routing
from espn.methods.base import Strategy
from espn.runs.config import ConfigError, RunConfig
from espn.supernet.supernet import Supernet
from espn.training.callbacks import TaskEnd
from espn.training.capacity import check_budget
from espn.training.engine import Engine
from espn.training.plan import TaskLog, TaskProgress

if TYPE_CHECKING:
    from espn.inference.export import AgnosticExportReport


@dataclass
class Learned:
    """What learning one step did: the tasks it committed, its log and accuracy row."""

    tasks: range
    log: TaskLog
    row: list[float] | None


class TaskRunner:
    """Learns steps through ``engine`` and records them in :attr:`rows` (one per step, None where
    not evaluated) and :attr:`records` (one per task, the supernet's tasks already counted),
    refusing a missed FLOPs budget."""

    def __init__(self, supernet: Supernet, strategy: Strategy, engine: Engine) -> None:
        self.supernet, self.strategy, self.engine = supernet, strategy, engine
        n = len(supernet.masks)
        self.rows: list[list[float] | None] = [None] * n
        self.records: list[dict[str, Any]] = [task_record(supernet, t) for t in range(n)]
        #: evaluates learned tasks through cached slim copies where the run trains slim
        self.evaluator = SlimEvaluator(supernet, enabled=engine.slim_training)

    def check_gamma_reachable(self, model: str | None) -> None:
        """Refuse, before training, a FLOPs budget gamma that no sub-network can meet."""
        gamma = self.strategy.cfg.gamma
        if not self.strategy.uses_gamma or gamma >= 1.0:
            return
        floor = self.supernet.floor_ratio()
        if gamma < floor:
            raise ConfigError(
                f"gamma {gamma:g} is below the smallest FLOPs ratio model "
                f"{model or 'this model'} can reach ({floor:.4g}, with one unit left in every "
                f"layer); use gamma >= {floor:.4g}"
            )

    def learn(
        self,
        step: Task,
        index: int,
        tasks: Sequence[Task | None],
        *,
        evaluate: bool = True,
        pretrained: dict[str, Tensor] | None = None,
        resume: TaskProgress | None = None,
    ) -> Learned:
        """Learn and record step ``index`` (from ``pretrained`` weights when given); ``tasks``: by
        index every task learned and committed (None: no data here), evaluated if ``evaluate``."""
        first = len(self.supernet.masks)
        hooks, owner = self.engine.callbacks, self.engine.owner
        hooks.on_task_start(owner, first, step.name)
        if pretrained is not None:
            log = self.engine.adopt_task(step, pretrained)
        elif self.engine.task_agnostic:  # a tenth held out to calibrate the task's scores
            log = self.engine.train_task(routing.held_out(step)[0], index, resume=resume)
        else:
            log = self.engine.train_task(step, index, resume=resume)
        learned = range(first, len(self.supernet.masks))  # one task, or all of them for MTL
        self.store_statistics(learned, tasks)
        row = self.accuracy_row(tasks, learned.stop) if evaluate else None
        self.rows.append(row)
        new = []
        for t in learned:
            task = tasks[t]
            record = task_record(self.supernet, t) | self.strategy.report()
            record |= {
                "weight_budget": self.strategy.weight_budget,
                "seconds": log.seconds / len(learned),
                "seconds_per_epoch": log.seconds_per_epoch,
                "phases": log.phases,
                "train_samples": 0 if task is None else len(task.train),
                "test_samples": 0 if task is None else len(task.test),
                "pretrained": pretrained is not None,  # from init weights: no budget applies
            }
            if log.compiled_graphs is not None:  # --compile: graphs compiled for the task
                record["compiled_graphs"] = log.compiled_graphs
            self.records.append(record)
            new.append((record, "" if task is None else task.name, t))
        for record, name, t in new:
            if self.strategy.uses_gamma and pretrained is None:
                check_budget(self.strategy.cfg.gamma, record, name, t)
        for record, name, t in new:
            hooks.on_task_end(owner, TaskEnd(t, name, row, record))
        return Learned(learned, log, row)

    def store_statistics(self, learned: range, tasks: Sequence[Task | None]) -> None:
        """Give each task just committed its task-agnostic statistics (from its data)."""
        for t in learned:
            task = tasks[t] if t < len(tasks) else None
            if task is not None and len(task.train):
                stats = routing.statistics(self.supernet, t, task, self.engine.task_agnostic)
                self.supernet.masks[t].stats = stats

    def accuracy_row(self, tasks: Sequence[Task | None], n: int) -> list[float] | None:
        """Accuracy (%) of tasks ``0..n-1``, or None when one has no test data here."""
        row = []
        for j in range(n):
            task = tasks[j]
            if task is None or not len(task.test):
                return None
            row.append(self.evaluator.accuracy(task, j))
        return row


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


class Report(list[dict[str, Any]]):
    """Per task, a dict of facts; printed, a table."""

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


class LearnedTasks:
    """Evaluation, prediction, report and export of the tasks in :attr:`supernet`."""

    if TYPE_CHECKING:
        supernet: Supernet
        runner: TaskRunner
        tasks: list[Task | None]
        names: list[str]
        replayed: int
        device: torch.device
        cfg: RunConfig

    @property
    def accuracy_matrix(self) -> list[list[float] | None]:
        """Row ``i``: accuracy (%) of tasks ``0..i`` after task ``i`` was learned (None where
        some task had no test data, or ``eval_every`` skipped it)."""
        return [None if r is None else list(r) for r in self.runner.rows]

    @overload
    def evaluate(
        self,
        task: int,
        data: TaskData | None = None,
        *,
        task_agnostic: Literal[False] = False,
        rule: None = None,
        batch_size: int = 1024,
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
        batch_size: int = 1024,
    ) -> float | dict[str, Any] | list[dict[str, Any]]:
        """Accuracy (%) of task ``task``'s sub-network on ``data`` (default: its test data).

        With ``task_agnostic=True``, prediction without the task by ``rule`` instead (see
        docs/task-agnostic.md): ``task`` is one ``(x, y)`` per learned task (default: their
        test data here); the figures of :func:`espn.inference.evaluate_task_agnostic`, a list
        of them with ``rule="all"``."""
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
        checks.check_task(task, len(self.supernet.masks))
        assert isinstance(task, int)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise checks.fail("batch_size", f"must be a positive int, got {batch_size!r}")
        known = self.tasks[task] if data is None else self._probe(task, data, "data")
        if known is None or not len(known.test):
            raise LearnerError(f"task {task} has no test data here; pass data=(x, y)")
        return self.runner.evaluator.accuracy(known, task, batch_size=batch_size)

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
            self._check_inputs(task.train.x, "data")
            if len(task.test):
                self._check_inputs(task.test.x, "test")
            checks.check_classes(task.n_classes, "n_classes" if classes is not None else "data")
            if not len(task.train):
                raise LearnerError(f"{name}: no training samples")
            tasks.append(task)
        return tasks

    def _probe(self, task: int, data: TaskData, argument: str) -> Task:
        """``data`` as test data of learned task ``task``, checked."""
        n_classes = self.supernet.masks[task].n_classes
        with checks.about(argument):
            probe = tensor_task(self.names[task], None, data, n_classes, self.device)
        self._check_inputs(probe.test.x, argument)
        return probe

    def _every_task(self, given: Sequence[TaskData] | None, argument: str) -> list[Task]:
        """One test set per learned task: ``given``, else each task's test data here."""
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

    def report(self) -> Report:
        """Per task: name, classes, FLOPs and ratio, weights used and owned, units kept, counted
        from the supernet now; a list of dicts that prints as a table."""
        return Report(
            {"task": t, "name": self.names[t], "n_classes": self.supernet.masks[t].n_classes}
            | task_record(self.supernet, t)
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
        """Write task ``task`` as a slim standalone model (``.pt2``/``.onnx``) as ``espn export``
        does, checked on ``data`` (default: its test, else training data); see docs/cli.md."""
        checks.check_task(task, len(self.supernet.masks))
        checks.check_export_path(path)
        check_target(path)
        known = self.tasks[task]
        if data is not None:
            with checks.about("data"):
                x = tensor_task(self.names[task], None, data, None, self.device).test.x
            self._check_inputs(x, "data")
            inputs, transform = list(x.split(1024)), None
        elif known is None:
            raise LearnerError(f"task {task} has no data here to check the export on; pass data")
        else:  # raw inputs in: the task's transform too
            split = "test" if len(known.test) else "train"
            inputs, transform = known.raw_inputs(split, 1024), known.transform
        if onnx and Path(path).suffix == ".pt2":
            from espn.export.export import ExportError, onnx_available

            if not onnx_available():
                raise ExportError(
                    "onnx=True needs the onnx and onnxscript packages: pip install espn[onnx]"
                )
        flops = self.runner.records[task]["flops"]  # as recorded (results.json) when learned
        return export_task(
            self.supernet,
            task,
            inputs,
            path,
            onnx,
            flops,
            fold_bn,
            transform,
            overwrite,
            self._run(),
        )

    def _run(self) -> Path | None:
        """The run directory this learner writes or was loaded from, if any."""
        return None if self.cfg.out == Path(".") else Path(self.cfg.out)

    def export_task_agnostic(
        self,
        path: Path | str,
        data: Sequence[TaskData] | None = None,
        rule: str | None = None,
        onnx: bool | None = None,
        fold_bn: bool = True,
        overwrite: bool = False,
    ) -> AgnosticExportReport:
        """Write one model that predicts ``(classes, tasks)`` without the task by ``rule``, checked
        against :meth:`predict` on each task's ``data``; the rest as :meth:`export`."""
        from espn.export.export import check_not_replacing, export_files
        from espn.inference.export import export_task_agnostic

        checks.check_export_path(path)
        check_target(path)
        check_not_replacing(export_files(path, onnx), overwrite, self._run())
        tasks = self._every_task(data, "data")
        inputs = [next(task.batches("test", 1024))[0] for task in tasks]
        return export_task_agnostic(self.supernet, inputs, path, rule, onnx, fold_bn)

    def infer_task(
        self, x: torch.Tensor, same_task: bool = False, rule: str | None = None
    ) -> torch.Tensor:
        """The task of each sample of ``x`` (one for all with ``same_task``), by ``rule``."""
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
        """Class predicted for each sample of ``x`` by task ``task``'s sub-network, or with
        ``task=None`` by that of the task :meth:`infer_task` infers for it."""
        from espn.inference import infer, predict_given

        checks.check_bool(same_task, "same_task")
        x = self._inputs(x)
        if task is not None:
            checks.check_task(task, len(self.supernet.masks))
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
        self._check_inputs(x, "x")
        return x.to(self.device)

    def _check_inputs(self, x: object, argument: str) -> None:
        """Refuse ``x`` unless it is a batch of the supernet's input shape and dtype."""
        checks.check_inputs(x, argument, self.supernet.input_shape, self.supernet.input_dtype)
