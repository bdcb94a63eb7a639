"""The Weights & Biases logger (the optional extra ``wandb``), offline unless ``mode`` or
``WANDB_MODE`` says otherwise; each process is one W&B run, its config the learner's run
settings (and ``config=``, which wins). Keys and their x-axes: docs/logging.md.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from espn.training.callbacks import EpochEnd, StepEnd
from espn.training.loggers.base import DEFAULT_LOG_EVERY, LoggerError, MetricLogger, TaskRecord

#: the W&B modes accepted (``disabled`` logs nothing)
Mode = Literal["offline", "online", "disabled"]
MODES: tuple[Mode, ...] = get_args(Mode)


def resolve_mode(mode: str | None) -> Mode:
    """``mode``, else ``WANDB_MODE``, else ``offline``; a :class:`LoggerError` if unknown."""
    chosen = mode or os.environ.get("WANDB_MODE") or "offline"
    if chosen in MODES:
        return chosen
    source = "mode" if mode else "WANDB_MODE"
    raise LoggerError(f"unknown W&B {source} {chosen!r}; choose one of: {', '.join(MODES)}")


class WandbLogger(MetricLogger):
    """Steps, epochs and tasks as a W&B run kept under ``directory`` (offline by default)."""

    name: ClassVar[str] = "wandb"
    extra: ClassVar[tuple[str, str] | None] = ("wandb", "wandb")

    def __init__(
        self,
        directory: Path | str,
        *,
        log_every: int = DEFAULT_LOG_EVERY,
        mode: str | None = None,
        project: str | None = None,
        run_name: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(directory, log_every=log_every)
        self.mode = resolve_mode(mode)
        self.project = project or os.environ.get("WANDB_PROJECT") or "espn"
        self.run_name = run_name
        self.config = dict(config or {})
        self._run: Any = None

    @classmethod
    def in_run(cls, run_dir: Path, *, log_every: int = DEFAULT_LOG_EVERY) -> WandbLogger:
        run_dir = Path(run_dir)
        return cls(run_dir / "logs", log_every=log_every, run_name=run_dir.resolve().name)

    @property
    def run(self) -> Any:
        """The W&B run, started on first use; every file W&B writes for it (the service's
        debug logs too, through ``WANDB_CACHE_DIR`` unless set) stays under
        :attr:`directory`. A run W&B cannot start (online without an account) is a
        :class:`LoggerError`, and the directories made for it are removed."""
        if self._run is None:
            import wandb

            made = [d for d in (self.directory, self.directory / "wandb") if not d.exists()]
            cache = "WANDB_CACHE_DIR" not in os.environ
            if cache:
                os.environ["WANDB_CACHE_DIR"] = str(self.directory / "wandb" / "cache")
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                run = wandb.init(
                    project=self.project,
                    name=self.run_name,
                    dir=str(self.directory),
                    mode=self.mode,
                    config=self.config,
                    reinit="create_new",
                    settings=wandb.Settings(console="off", silent=True, save_code=False),
                )
            except (wandb.errors.Error, TimeoutError) as exc:
                if made:
                    shutil.rmtree(made[0], ignore_errors=True)
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise LoggerError(
                    f"W&B could not start its {self.mode} run: {first} (to log without an "
                    "account: WANDB_MODE=offline)"
                ) from None
            finally:
                if cache:
                    del os.environ["WANDB_CACHE_DIR"]
            run.define_metric("task_step")
            run.define_metric("tasks_learned")
            for key in ("loss/*", "lr/*", "epoch_loss/*", "phase"):
                run.define_metric(key, step_metric="task_step")
            for key in ("accuracy/*", "flops_ratio", "weights/*", "time/*"):
                run.define_metric(key, step_metric="tasks_learned")
            self._run = run
        return self._run

    def on_run_start(self, learner: Any) -> None:
        super().on_run_start(learner)
        settings: Any = getattr(learner, "cfg", None)  # the learner's run settings
        if hasattr(settings, "model_dump"):
            self.config = {**settings.model_dump(mode="json"), **self.config}
        _ = self.run

    def log_step(self, event: StepEnd, loss: float, elapsed: float) -> None:
        t = event.task
        self.run.log(
            {
                "task_step": event.step,
                "phase": event.phase,
                f"loss/task_{t}": loss,
                f"lr/task_{t}": event.lr,
            }
        )

    def log_epoch(self, event: EpochEnd, elapsed: float) -> None:
        self.run.log({"task_step": event.step, f"epoch_loss/task_{event.task}": event.loss})

    def log_task(self, record: TaskRecord) -> None:
        self.run.log({"tasks_learned": record.task, **record.scalars()})

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
