"""The learner's side of its run directory (:class:`~espn.runs.resuming.RunDirectory`): opening
and resuming it, the data a resumed script gives again, :meth:`LearnerRuns.save`."""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import torch

from espn.api.checks import LearnerError, check_save_path
from espn.api.tasks import LearnedTasks
from espn.data.tasks import Split, Task, TaskSequence
from espn.data.tensors import identity, load_task, save_task, task_path
from espn.methods.base import Strategy
from espn.runs.building import build_benchmark
from espn.runs.checks import (
    DirectoryLock,
    RunMismatch,
    check_out_dir,
    clear_run,
    run_meta,
)
from espn.runs.config import RunConfig
from espn.runs.from_run import check_source_unchanged
from espn.runs.loading import SavedRun
from espn.runs.resuming import RunDirectory, finished
from espn.training.engine import Engine

#: where a Python run directory keeps the test data its accuracy matrix was computed on
DATA_DIR = "data"


def fingerprint(task: Task) -> str:
    """SHA-256 of a task's data (both splits, as the engine sees them): how a resumed Python
    run checks that it is given the data it learned before."""
    digest = hashlib.sha256()
    for split in ("train", "test"):
        data = task.split(split)
        x, y = data.x[data.index], data.y
        for t in (x, y):
            digest.update(str((t.dtype, tuple(t.shape))).encode())
            digest.update(t.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


class LearnerRuns(LearnedTasks):
    """The learner's side of its run directory: opening and resuming one, checking that a resumed
    script gives the same data, the writes after every step, :meth:`save`."""

    if TYPE_CHECKING:
        from espn.training.callbacks import CallbackList
        from espn.training.distributed import Ranks

        strategy: Strategy
        engine: Engine
        callbacks: CallbackList
        ranks: Ranks | None
        fingerprints: list[str]
        summary: str
        run_dir: RunDirectory | None
        lock: DirectoryLock | None
        _started: bool

    def open_run(
        self,
        rd: RunDirectory,
        resume: bool,
        adopt: Callable[[], tuple[list[list[float] | None], list[dict[str, Any]]]] | None = None,
        ignore: tuple[str, ...] = (),
    ) -> None:
        """Write ``rd`` from now on, resuming its run unless not ``resume``; ``adopt``: the rows and
        records of the tasks a fresh run starts on top of (``--from-run``)."""
        rd.open(self.supernet, self.engine, self.strategy, resume, ignore)
        if adopt is not None and not rd.rows:
            rd.rows, rd.per_task = adopt()
        manifest = rd.manifest or {}
        self._hold(manifest.get("tasks", []), rd.rows, rd.per_task)
        self.replayed = 0  # a resumed script gives the tasks again (checked, not learned)
        self.fingerprints = [str(f) for f in manifest.get("fingerprints", [])]
        self.summary = rd.summary or self.summary
        self.run_dir = rd
        self.callbacks.append(rd)

    def hold_run(
        self, loaded: SavedRun, benchmark_data: bool = False, data_dir: Path | str | None = None
    ) -> None:
        """Hold a loaded run's finished tasks, with the test data saved beside a Python run or, with
        ``benchmark_data``, the benchmark read from ``data_dir`` (never downloaded)."""
        entries, cfg = loaded.checkpoint.tasks, loaded.config
        self._hold(entries, *finished(entries))
        if data_dir is not None:
            cfg = cfg.model_copy(update={"data_dir": Path(data_dir).resolve()})
        if cfg.benchmark == "tensors" and cfg.data_dir is not None:
            for t in range(len(entries)):
                file = task_path(cfg.data_dir, t)
                self.tasks[t] = load_task(file, self.device) if file.is_file() else None
        elif benchmark_data and entries:
            check_source_unchanged(cfg.out, cfg, entries)
            seq = build_benchmark(cfg, download=False)
            self.tasks = [seq.tasks[t] for t in range(len(entries))]

    def _hold(
        self,
        entries: list[dict[str, Any]],
        rows: list[list[float] | None],
        records: list[dict[str, Any]],
    ) -> None:
        """Take a run's finished tasks (checkpoint entries) as this learner's, data unknown."""
        n = len(self.supernet.masks)
        self.runner.rows, self.runner.records = rows, records
        self.names = [str(e.get("name") or f"task {t}") for t, e in enumerate(entries)]
        self.names += [f"task {t}" for t in range(len(self.names), n)]
        self.tasks = [None] * n

    def close(self) -> None:
        """The end of learning: callbacks' ``on_run_end``; the lock released."""
        if self._started:
            self._started = False
            self.callbacks.on_run_end(self)
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _claim(self, out: Path, overwrite: bool) -> DirectoryLock:
        """Hold ``out`` against other writers, checked (an overwritten run's files gone)."""
        lock = DirectoryLock(out)
        weakref.finalize(self, lock.release)
        try:
            check_out_dir(out, resume=not overwrite, overwrite=overwrite, python=True)
            if overwrite:
                clear_run(out)
                for stale in (out / DATA_DIR).glob("task-*.safetensors"):
                    stale.unlink()
        except BaseException:
            lock.release()
            raise
        return lock

    def _open(self, out: Path, resume: bool) -> None:
        """Write the Python run directory ``out`` from now on, resuming it if ``resume``."""
        rd = self._directory(out, {})
        try:
            self.open_run(rd, resume, ignore=("tasks",))
        except RunMismatch as exc:
            raise LearnerError(
                f"cannot resume {exc.where}: it was made with other settings "
                f"({'; '.join(exc.diffs)}); give the learner the same method and settings to "
                "resume it, overwrite=True to start over and replace it, or another out="
            ) from None

    def _directory(self, out: Path, extra: dict[str, Any]) -> RunDirectory:
        """A run directory ``out`` of this learner's tasks (``extra``: in its manifest)."""
        return RunDirectory(self.config(out), self._sequence, meta=lambda: self._meta(out, extra))

    def _replay(self, tasks: list[Task]) -> list[dict[str, Any]]:
        """Tasks a resumed script gives again: checked against their data, kept, not learned."""
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
        return self.runner.records[first : first + len(tasks)]

    def _check_resumed(self, known: Sequence[Task | None], base: int) -> None:
        """Refuse other data for the task in training in the run directory."""
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
        """After a step: a Python run's test data, the checkpoint, results.json, the plot."""
        if rd.meta is not None and rd.writes:  # a Python run: its data beside it
            rd.cfg = self.config(rd.out)
            for t, task in enumerate(self.tasks):
                file = task_path(rd.out / DATA_DIR, t)
                if task is not None and len(task.test) and not file.exists():
                    save_task(file, task, splits=("test",))
        rd.step_done(self.runner.rows, self.runner.records)
        rd.plot()

    def _meta(self, out: Path, extra: dict[str, Any]) -> dict[str, Any]:
        """What the checkpoint of run directory ``out`` records about the run (with ``extra``)."""
        seq = self._sequence()
        meta = run_meta(self.config(out), seq)
        width = self.supernet.model_classes  # the head a registered model was built with
        classes = [m.n_classes for m in self.supernet.masks] + [width or 1]
        meta["spec"]["n_classes"] = max(classes)
        meta["spec"]["input_dtype"] = str(self.supernet.input_dtype).removeprefix("torch.")
        meta["n_tasks"] = max(len(seq), 1)  # as ``tasks`` is: task 0 in training counts
        return meta | extra | {"fingerprints": list(self.fingerprints)}

    def config(self, out: Path | str) -> RunConfig:
        """The run configuration a checkpoint in ``out`` records for this learner."""
        return self.cfg.model_copy(
            update={"out": Path(out), "tasks": max(len(self.supernet.masks), 1)}
        )

    def save(self, path: Path | str, overwrite: bool = False) -> Path:
        """Save every learned task as ``espn run`` does, the test data in ``path/data`` for ``espn
        evaluate``; a directory holding another run is refused unless ``overwrite``."""
        path = check_save_path(path)
        if not self.supernet.masks:
            raise LearnerError("nothing to save: no task is learned yet")
        if self.ranks is not None and not self.ranks.writer:  # rank 0 saves the run
            return path
        check_out_dir(path, resume=False, overwrite=overwrite, python=True)
        for stale in (path / DATA_DIR).glob("task-*.safetensors"):  # of an overwritten run
            stale.unlink()
        for name in ("results.json", "accuracy.png"):
            (path / name).unlink(missing_ok=True)
        rd = self._directory(path, {"saved_by": "api"})
        rd.open(self.supernet, self.engine, self.strategy, False)
        self._write(rd)
        return path

    def _sequence(self) -> TaskSequence:
        """The learned tasks as a sequence (names and class counts), for the records."""
        empty = Split(torch.zeros(0, 1), torch.zeros(0, dtype=torch.long), torch.zeros(0))
        tasks = [
            Task(self.names[t], empty, empty, identity, m.n_classes)
            for t, m in enumerate(self.supernet.masks)
        ]
        return TaskSequence("tensors", tasks, tuple(self.supernet.input_shape), self._multi_head())

    def _multi_head(self) -> bool:
        from espn.supernet.layers import TaskHead

        return any(isinstance(m, TaskHead) for m in self.supernet.task_modules.values())
