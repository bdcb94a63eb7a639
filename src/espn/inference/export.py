"""One standalone model that predicts without the task (``(classes, tasks)`` per batch): every
task's slim sub-network, the rule's statistics and the rule, checked against
:func:`espn.inference.infer` before it is reported written (docs/task-agnostic.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from espn.export.export import (
    _write_pt2,
    check_request,
    exported,
    ieee_float32,
    onnx_available,
    write_onnx,
)
from espn.export.slim import ExportError, fold_batchnorm, slim_copy
from espn.inference.outputs import head_name
from espn.inference.predict import DEFAULT_RULE, Inferred, get_rule, infer
from espn.inference.rule import OutputRule, calibration
from espn.inference.statistics import raw_scores
from espn.layers.base import call_hooked
from espn.supernet.supernet import Supernet
from espn.utils.io import write_json_atomic

#: scores or logits closer than this (relative to max(1, |value|)) are a tie that float32
#: rounding of the slim model may break either way; such samples are not compared
MARGIN = 1e-4


class WithFeatures(nn.Module):
    """A slim sub-network returning ``(logits, input of its head module)``."""

    def __init__(self, net: nn.Module, head: str) -> None:
        super().__init__()
        self.net = net
        self.head = net.get_submodule(head)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        seen: list[Tensor] = []
        hook = self.head.register_forward_pre_hook(lambda m, inputs: seen.append(inputs[0]))
        logits = call_hooked(self.net, [hook], x)
        if len(seen) != 1:
            raise ExportError(f"the sub-network calls its head {len(seen)} times; once is needed")
        return logits, seen[0]


class TaskAgnosticModel(nn.Module):
    """Every task's slim sub-network and the rule that picks among them."""

    def __init__(
        self,
        nets: list[nn.Module],
        stats: list[dict[str, Tensor]],
        calib: Tensor,
        rule: OutputRule,
    ) -> None:
        super().__init__()
        self.nets = nn.ModuleList(nets)
        self.rule = rule
        self.uses_features = rule.uses_features
        self.uses_input = rule.uses_input
        #: the statistics the rule reads, held per task as buffers named KEY + task
        self.keys = [
            *(("class_means", "variance") if rule.uses_features else ()),
            *(("input_means", "input_variance") if rule.uses_input else ()),
        ]
        for t, st in enumerate(stats):
            for k in self.keys:
                self.register_buffer(f"{k}{t}", st[k].clone())
        self.register_buffer("calibration", calib.clone())

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        raws, preds = [], []
        for t, net in enumerate(self.nets):
            logits, features = net(x)
            preds.append(logits.argmax(1))
            stats = {k: self.get_buffer(f"{k}{t}") for k in self.keys}
            feats = features.flatten(1) if self.uses_features else None
            raws.append(raw_scores(logits, feats, stats, x if self.uses_input else None))
        scores = self.rule.combine(torch.stack(raws, 1), self.get_buffer("calibration"))
        tasks = scores.argmin(1)
        classes = torch.stack(preds).gather(0, tasks[None])[0]
        return classes, tasks


def build(supernet: Supernet, example: Tensor, rule: OutputRule, fold_bn: bool = True) -> nn.Module:
    """The task-agnostic model of ``supernet`` for ``rule`` (traced on ``example``)."""
    head = head_name(supernet)
    nets: list[nn.Module] = []
    for t in range(len(supernet.masks)):
        slim = slim_copy(supernet, t, example)
        if fold_bn:
            fold_batchnorm(slim, example)
        nets.append(WithFeatures(slim, head))
    stats = [m.stats for m in supernet.masks]
    return TaskAgnosticModel(nets, stats, calibration(supernet), rule).eval()


@dataclass
class AgnosticExportReport:
    """What was written and how it was checked against :func:`espn.inference.infer`."""

    files: list[str]
    rule: str
    tasks: int
    checked_samples: int
    ties: int
    parameters: int


@torch.no_grad()
def _check(model: nn.Module, inputs: list[Tensor], wanted: list[Inferred], what: str) -> int:
    """Compare ``model``'s classes and tasks with ``wanted`` (:func:`infer`'s on ``inputs``)
    on every input sample whose decision is not a float32 tie; return the number of ties."""
    ties = 0
    with ieee_float32():
        for x, want in zip(inputs, wanted, strict=True):
            classes, tasks = model(x)
            top2 = want.scores.topk(min(2, want.scores.shape[1]), dim=1, largest=False).values
            margin = (
                (top2[:, -1] - top2[:, 0])
                if top2.shape[1] > 1
                else torch.full_like(top2[:, 0], float("inf"))
            )
            tie = margin <= MARGIN * top2[:, 0].abs().clamp_min(1.0)
            wrong = ((classes != want.classes) | (tasks != want.tasks)) & ~tie
            if bool(wrong.any()):
                raise ExportError(
                    f"{what} picks another task or class than espn's predict on "
                    f"{int(wrong.sum())} of {len(x)} samples"
                )
            ties += int(tie.sum())
    return ties


def export_task_agnostic(
    supernet: Supernet,
    inputs: list[Tensor],
    out: Path | str,
    rule: str | None = None,
    also_onnx: bool | None = None,
    fold_bn: bool = True,
) -> AgnosticExportReport:
    """Write the task-agnostic model of ``supernet`` for ``rule`` to ``out`` (``.pt2``, and
    ``.onnx`` beside it when ONNX export is available, or ``.onnx`` alone), checked against
    :func:`espn.inference.infer` on ``inputs`` (batches of model inputs) before and after
    saving; a ``.json`` report is written beside it."""
    out = check_request(out, inputs)
    found = get_rule(rule, supernet)
    if rule is None and not isinstance(found, OutputRule):  # the run's default (input-subspace)
        found = get_rule(DEFAULT_RULE, supernet)
    if not isinstance(found, OutputRule):
        raise ExportError(
            f"rule {found.name!r} cannot be exported (supsup-oneshot needs gradients at "
            "inference; input-subspace's mixtures are not built into the graph); "
            "export with --rule input-gaussian, entropy, energy, mahalanobis or "
            "entropy-mahalanobis"
        )
    example = inputs[0][:2].clone()
    model = build(supernet, example, found, fold_bn)
    with ieee_float32(), torch.no_grad():  # espn's prediction, computed once for both checks
        wanted = [infer(supernet, x, found) for x in inputs]
    ties = _check(model, inputs, wanted, "the task-agnostic model")
    files = []
    program = exported(model, example)
    if out.suffix == ".pt2":
        loaded = _write_pt2(program, out)
        ties = max(ties, _check(loaded, inputs, wanted, "the saved model"))
        files.append(str(out))
        if also_onnx is None:
            also_onnx = onnx_available()
        if also_onnx:
            write_onnx(program, example, out.with_suffix(".onnx"), ("class", "task"))
            files.append(str(out.with_suffix(".onnx")))
    else:
        write_onnx(program, example, out, ("class", "task"))
        files.append(str(out))
    report = AgnosticExportReport(
        files=files,
        rule=found.name,
        tasks=len(supernet.masks),
        checked_samples=sum(len(x) for x in inputs),
        ties=ties,
        parameters=sum(p.numel() for p in model.parameters()),
    )
    write_json_atomic(out.with_suffix(".json"), asdict(report))
    return report
