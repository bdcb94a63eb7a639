"""The interface of a task-inference rule and the registry of rules by name; see
docs/task-agnostic.md, "Adding a rule"."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import Tensor

from espn.inference.outputs import InferenceError, TaskOutputs, head_name, task_outputs
from espn.inference.statistics import SCORES, STAT_KEYS, raw_scores
from espn.registry import Registry
from espn.supernet.supernet import Supernet


class Rule(ABC):
    """How the task of a sample is inferred."""

    name: ClassVar[str]
    #: one line: what the rule does
    summary: ClassVar[str]
    #: the statistics it reads (every task must store them; see :data:`STAT_KEYS`)
    needs: ClassVar[tuple[str, ...]] = ()
    #: what would work where a task stores none
    instead: ClassVar[str] = "use rule 'entropy', or learn the tasks again with this espn"

    def check(self, supernet: Supernet) -> None:
        """Refuse, before any work, a supernet this rule cannot run on."""
        if not supernet.masks:
            raise InferenceError("no task is learned yet: there is no task to infer")
        missing = [t for t, m in enumerate(supernet.masks) if not set(self.needs) <= set(m.stats)]
        if missing:
            raise InferenceError(
                f"rule {self.name!r} reads statistics each task stores when it is learned, "
                f"and tasks {missing} have none; {self.instead}"
            )

    @abstractmethod
    def scores(self, supernet: Supernet, x: Tensor) -> tuple[Tensor, TaskOutputs | None]:
        """Scores (N, T) of the samples ``x`` for every task, and the tasks' outputs when the
        rule computed them (their logits then give the prediction at no further cost)."""

    def passes(self, flops_ratios: list[float]) -> float:
        """Inference FLOPs per sample, in dense passes, given each task's FLOPs ratio:
        inferring the task and predicting the class. Here one pass of the chosen task's
        sub-network (on average over the tasks), for a rule that runs no sub-network to
        infer the task (the cost of its statistics left out: ``2 C D`` per task for
        ``input-gaussian``, below 0.01 dense passes for FC1024)."""
        return sum(flops_ratios) / max(len(flops_ratios), 1)


class OutputRule(Rule):
    """A rule that scores each task from its raw scores (:data:`SCORES`): its sub-network's
    outputs on the sample, and/or the sample itself under the task's input statistics."""

    #: whether :meth:`combine` reads the sub-networks' outputs (logits; else no sub-network
    #: runs to infer the task, and only the chosen one runs to classify)
    uses_outputs: ClassVar[bool] = True
    #: whether it reads the penultimate features' distance
    uses_features: ClassVar[bool] = False
    #: whether it reads the input's likelihood under the task's input statistics
    uses_input: ClassVar[bool] = False

    @abstractmethod
    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        """Scores (N, T) from the raw scores ``raw`` (N, T, 4) and the tasks' calibration
        (T, 4, 2: mean and standard deviation of each raw score on the task's training
        data). Tensor operations only: it also runs inside an exported model."""

    def scores(self, supernet: Supernet, x: Tensor) -> tuple[Tensor, TaskOutputs | None]:
        if not self.uses_outputs:
            return self.score_outputs(supernet, None, x), None
        tasks = range(len(supernet.masks))
        head = head_name(supernet) if self.uses_features else None
        out = task_outputs(supernet, x, tasks, head)
        return self.score_outputs(supernet, out, x), out

    def score_outputs(self, supernet: Supernet, out: TaskOutputs | None, x: Tensor) -> Tensor:
        """The scores of the samples ``x`` from the tasks' outputs ``out`` on them, already
        computed (with features if the rule uses them; None if it reads no output)."""
        raw = torch.stack(
            [
                raw_scores(
                    out.logits[t] if out is not None and self.uses_outputs else None,
                    out.features[t] if out is not None and self.uses_features else None,
                    m.stats,
                    x if self.uses_input else None,
                )
                for t, m in enumerate(supernet.masks)
            ],
            1,
        )
        return self.combine(raw, calibration(supernet).to(raw.device))

    def passes(self, flops_ratios: list[float]) -> float:
        """One pass of every task's sub-network (the chosen task's logits are reused), or,
        for a rule reading no output, one pass of the chosen task's."""
        return float(sum(flops_ratios)) if self.uses_outputs else super().passes(flops_ratios)


def calibration(supernet: Supernet) -> Tensor:
    """The tasks' calibrations stacked (T, 4, 2); NaN for a task without statistics."""
    return torch.stack(
        [
            m.stats["calibration"].float()
            if "calibration" in m.stats
            else torch.full((len(SCORES), 2), float("nan"))
            for m in supernet.masks
        ]
    )


def standardised(raw: Tensor, calibration: Tensor, column: int) -> Tensor:
    """Raw score ``column`` standardised by each task's training mean and deviation."""
    mean, std = calibration[:, column, 0], calibration[:, column, 1]
    return (raw[..., column] - mean) / std


def atypical(raw: Tensor, calibration: Tensor, column: int) -> Tensor:
    """How far raw score ``column`` lies from the task's typical value, in its deviations, in
    either direction (why: docs/task-agnostic.md, "The rules")."""
    return standardised(raw, calibration, column).abs()


#: the task-inference rules by name
RULES: Registry[type[Rule]] = Registry("task-inference rule", names=True)


# ------------------------------------------------------------------ the output rules
@RULES.register("entropy-mahalanobis")
class EntropyMahalanobis(OutputRule):
    """The entropy's distance to the task's typical entropy plus the standardised
    Mahalanobis distance: a sample must be classified as the task's own data are and lie
    close to a class mean of the task's features."""

    summary = "|standardised entropy| + standardised Mahalanobis distance"
    needs = STAT_KEYS
    uses_features = True

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return atypical(raw, calibration, 0) + standardised(raw, calibration, 2)


@RULES.register("energy")
class Energy(OutputRule):
    """The most typical energy ``E = -logsumexp`` of the logits (Liu et al. 2020's
    out-of-distribution score): the lowest ``|E(x) - mean_t| / std_t``."""

    summary = "energy -logsumexp(logits) closest to the task's own, in its deviations"
    needs = STAT_KEYS

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return atypical(raw, calibration, 1)


@RULES.register("entropy")
class Entropy(OutputRule):
    """The most confident sub-network: the lowest softmax entropy relative to its head's
    largest entropy ``log C`` (so that heads of different sizes compare); stores nothing."""

    summary = "lowest softmax entropy / log C over the tasks' sub-networks (stores nothing)"

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return raw[..., 0]


@RULES.register("input-gaussian")
class InputGaussian(OutputRule):
    """The highest likelihood of the input under the task's stored class Gaussians (equal
    mixture, equal task priors); only the chosen sub-network runs (docs/task-agnostic.md)."""

    summary = (
        "highest likelihood of the input under the task's stored per-class diagonal Gaussians "
        "of its inputs; only the chosen sub-network runs"
    )
    needs = STAT_KEYS
    uses_outputs = False
    uses_input = True

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return raw[..., 3]


@RULES.register("mahalanobis")
class Mahalanobis(OutputRule):
    """The lowest distance of the penultimate features to a class mean of the task's own
    (diagonal Mahalanobis), standardised by the task's training distances."""

    summary = (
        "nearest class mean of the sub-network's penultimate features (diagonal Mahalanobis "
        "distance), standardised by the task's training distances"
    )
    needs = STAT_KEYS
    uses_features = True

    def combine(self, raw: Tensor, calibration: Tensor) -> Tensor:
        return standardised(raw, calibration, 2)
