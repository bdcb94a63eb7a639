"""espn's methods as an Avalanche strategy for task-incremental benchmarks (see
docs/avalanche.md): ``ESPNStrategy`` in place of ``Naive`` learns every experience as one task
of a supernet through :class:`~espn.api.learner.ContinualLearner`, reports each task's FLOPs and
weights as metrics, and leaves evaluation to Avalanche's own loop."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

try:
    from avalanche.evaluation.metric_results import MetricValue
    from avalanche.training.plugins.evaluation import default_evaluator
    from avalanche.training.templates import SupervisedTemplate
except ImportError as exc:  # an optional dependency: say how to get it
    raise ImportError(
        "espn's Avalanche integration needs avalanche-lib: pip install 'espn[avalanche]' "
        f"(importing it failed: {exc})"
    ) from exc

from espn.api.functions import ContinualLearner, wrap
from espn.errors import EspnError
from espn.methods.base import Strategy
from espn.runs.method import create_method
from espn.settings.training import OPTIMIZER_SETTINGS, default
from espn.supernet.supernet import Supernet
from espn.training.optim import OPTIMIZERS, OptimConfig


class StrategyError(EspnError, ValueError):
    """A stream, optimizer or setting the strategy cannot learn from."""


#: torch optimizer classes espn's engine can rebuild, by the engine's names
TORCH_OPTIMIZERS = {
    torch.optim.SGD: "sgd",
    torch.optim.Adam: "adam",
    torch.optim.RMSprop: "rmsprop",
}


def split_epochs(total: int) -> tuple[int, int, int]:
    """Avalanche's ``train_epochs`` as espn's (pre-train, prune, fine-tune) epochs, in the
    proportions of espn's default 3,4,3 (1 epoch: all pruning)."""
    if total < 1:
        raise StrategyError(f"train_epochs must be >= 1, got {total}")
    pre = fine = total * 3 // 10
    return pre, total - pre - fine, fine


def optim_config(optimizer: torch.optim.Optimizer | str | None) -> OptimConfig:
    """espn's optimizer settings from a torch optimizer (its class and first parameter
    group), an optimizer name, or None (Adam at 1e-3)."""
    if optimizer is None or isinstance(optimizer, str):
        name = optimizer or "adam"
        if name not in OPTIMIZERS:
            raise StrategyError(
                f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}"
            )
        return OptimConfig(name)
    known = TORCH_OPTIMIZERS.get(type(optimizer))
    if known is None:
        raise StrategyError(
            f"optimizer {type(optimizer).__name__} is not one espn's engine runs; use "
            "torch.optim.SGD, Adam or RMSprop (or their names)"
        )
    group = optimizer.param_groups[0]
    return OptimConfig(
        known,
        lr=float(group["lr"]),
        weight_decay=float(group.get("weight_decay", default("weight_decay"))),
        momentum=float(group.get("momentum", default("momentum"))),
        betas=tuple(group.get("betas", default("betas"))),
    )


class ESPNStrategy(SupervisedTemplate):
    """An Avalanche strategy that learns each experience (one task label, learned once) as
    one espn task (docs/avalanche.md); ``method`` and ``settings`` go to
    :func:`espn.create_method`, ``criterion`` is Avalanche's evaluation loss only."""

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | str | None = None,
        criterion: Any = None,
        train_mb_size: int = 128,
        train_epochs: int = 10,
        eval_mb_size: int | None = 512,
        device: str | torch.device = default("device"),
        plugins: list[Any] | None = None,
        evaluator: Any = default_evaluator,
        eval_every: int = -1,
        method: str | type[Strategy] = "espn",
        seed: int = default("seed"),
        progress: bool = False,
        **settings: Any,
    ) -> None:
        self.optim = optim_config(optimizer)
        settings.setdefault("epochs", split_epochs(train_epochs))
        self.method: Strategy = create_method(method, **settings)
        super().__init__(
            model=model,
            optimizer=optimizer if isinstance(optimizer, torch.optim.Optimizer) else None,
            criterion=criterion or nn.CrossEntropyLoss(),
            train_mb_size=train_mb_size,
            train_epochs=train_epochs,
            eval_mb_size=eval_mb_size,
            device=device,
            plugins=plugins,
            evaluator=evaluator,
            eval_every=eval_every,
        )
        self.seed, self.progress = seed, progress
        self.given_supernet = model if isinstance(model, Supernet) else None
        #: espn's learner, made on the first experience (save, export, report, records)
        self.learner: ContinualLearner | None = None
        #: Avalanche task label -> espn task index, and the task's classes (the head's outputs)
        self.task_index: dict[int, int] = {}
        self.task_classes: dict[int, Tensor] = {}
        #: per task label: FLOPs, FLOPs ratio, new and used weights, units kept, budget, time
        self.task_records: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ training
    def make_optimizer(self, **kwargs: Any) -> None:
        """Nothing to do: espn's engine builds each task's optimizer from :attr:`optim`."""

    def _train_exp(self, experience: Any, eval_streams: Any = None, **kwargs: Any) -> None:
        """Learn the experience as one task, in place of Avalanche's epoch loop."""
        label, x, y = self._read(self.adapted_dataset, experience)
        if label in self.task_index:
            raise StrategyError(
                f"task label {label} is learned already; espn learns each task once "
                "(a task-incremental stream: one experience per task)"
            )
        classes, local = torch.unique(y, sorted=True, return_inverse=True)
        learner = self._learner(x)
        record = learner.learn((x, local), n_classes=len(classes), name=f"task {label}")
        self.task_index[label] = len(learner.supernet.masks) - 1
        self.task_classes[label] = classes
        self.task_records[label] = record
        self._publish(label, record)
        self.model = learner.supernet

    @property
    def supernet(self) -> Supernet | None:
        """The supernet the tasks are learned into (None before the first experience)."""
        return self.learner.supernet if self.learner is not None else self.given_supernet

    def _learner(self, x: Tensor) -> ContinualLearner:
        """espn's learner, made on the first experience (the model traced on two inputs)."""
        if self.learner is None:
            model = self.given_supernet or wrap(self.model.to(self.device), x[:2])
            torch.manual_seed(self.seed)
            self.learner = ContinualLearner(
                model,
                self.method,
                batch_size=self.train_mb_size,
                **{n: getattr(self.optim, n) for n in OPTIMIZER_SETTINGS},
                device=self.device,
                seed=self.seed,
                progress=self.progress,
            )
        return self.learner

    @torch.no_grad()
    def _read(self, dataset: Any, experience: Any) -> tuple[int, Tensor, Tensor]:
        """The experience's task label and samples (eval transforms), on the device."""
        loader = torch.utils.data.DataLoader(
            dataset.eval(), batch_size=max(self.eval_mb_size or 256, 1), shuffle=False
        )
        with torch.random.fork_rng(devices=[]):  # the loader's seed draw leaves training's alone
            batches = list(loader)
        if any(len(batch) < 3 for batch in batches):
            raise StrategyError(
                f"experience {experience.current_experience} has no task labels; espn "
                "learns task-incremental streams (e.g. task_incremental_benchmark(...))"
            )
        xs, ys, ts = ([batch[i] for batch in batches] for i in (0, 1, -1))
        labels = torch.cat(ts).unique().tolist()
        if len(labels) != 1:
            raise StrategyError(
                f"experience {experience.current_experience} holds task labels {labels}; "
                "espn learns one task per experience"
            )
        return int(labels[0]), torch.cat(xs).to(self.device), torch.cat(ys).long().to(self.device)

    def _publish(self, label: int, record: dict[str, Any]) -> None:
        """The task's FLOPs and weights as Avalanche metric values."""
        x = self.clock.train_exp_counter
        for metric, key in (
            ("FLOPs_Ratio_Exp", "flops_ratio"),
            ("FLOPs_Exp", "flops"),
            ("New_Weights_Exp", "new_weights"),
        ):
            name = f"{metric}/train_phase/train_stream/Task{label:03d}"
            self.evaluator.publish_metric_value(MetricValue(self, name, record[key], x))

    # --------------------------------------------------------------- evaluation
    def forward(self) -> Tensor:
        """Logits of the mini-batch, each sample through its task's sub-network."""
        width = int(self.mb_y.max()) + 1 if self.mb_y.numel() else 0
        return self.predict(self.mb_x, self.mb_task_id, width)

    @torch.no_grad()
    def predict(self, x: Tensor, task_labels: Tensor, width: int = 0) -> Tensor:
        """Logits over the original class ids (at least ``width``): task ``t``'s head scores
        its classes, the others get ``-inf``; a task not learned yet gets zeros."""
        known = [int(c.max()) + 1 for c in self.task_classes.values()]
        out = torch.zeros(len(x), max([width, *known, 1]), device=x.device)
        if self.supernet is None:
            return out
        self.supernet.eval()
        for label in task_labels.unique().tolist():
            if label not in self.task_index:
                continue
            rows = (task_labels == label).nonzero().squeeze(1)
            logits = self.supernet(x[rows], task=self.task_index[label])
            scores = torch.full((len(rows), out.shape[1]), -math.inf, device=x.device)
            scores[:, self.task_classes[label]] = logits.float()
            out[rows] = scores
        return out


# Avalanche wraps a strategy's __init__ to refuse keywords that no __init__ in the class's MRO
# names; the method's settings arrive in **settings and are checked by create_method (which
# names the accepted ones), so ESPNStrategy keeps its own __init__.
ESPNStrategy.__init__ = ESPNStrategy.__init__.__wrapped__  # type: ignore[attr-defined,method-assign]
