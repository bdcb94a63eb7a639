"""Writing one task as a standalone model file (``.pt2`` and/or ``.onnx``, raw inputs in),
loaded back and checked against the supernet before it is reported written: see
docs/checkpoints.md."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from espn.export.inputs import WithInputs, describe_transform, has_transform
from espn.export.slim import ExportError, fold_batchnorm, slim_copy
from espn.export.targets import (
    check_not_replacing,
    check_target,
    export_files,
    onnx_available,
    writing,
)
from espn.supernet.supernet import Supernet
from espn.utils.io import atomic_target, write_json_atomic
from espn.utils.transforms import BatchTransform

#: outputs must match the supernet's within TOLERANCE x max(1, largest |supernet output|):
#: 1e-5 absolute for outputs up to 1, and 1e-5 relative to the largest output beyond, the
#: float32 rounding that folding gates into weights can cause on large logits (a model with
#: BatchNorm folded also gets the measured float32 rounding of both, see float32_rounding)
TOLERANCE = 1e-5


def _cpu_attention_flops(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
    return int(sdpa_flop_count(query.shape, key.shape, value.shape))


_cpu_attention_flops._get_raw = True  # type: ignore[attr-defined]

#: what ``FlopCounterMode`` counts beside its own table: ``F.scaled_dot_product_attention``
#: on the CPU (torch counts its CUDA kernels, ``QK^T`` and ``AV``, but not its CPU kernel),
#: so that attention costs the same on every device, fused or written as two matmuls
EXTRA_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}


def flop_counter() -> FlopCounterMode:
    """A ``FlopCounterMode`` that also counts :data:`EXTRA_FLOPS`."""
    return FlopCounterMode(display=False, custom_mapping=EXTRA_FLOPS)


def measured_flops(model: nn.Module, example: Tensor) -> int:
    """FLOPs of one sample through ``model`` as ``FlopCounterMode`` counts them (CPU
    attention included, see :data:`EXTRA_FLOPS`), with gradients on: without them
    ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` take a fused inference path
    whose projections and attention FlopCounterMode does not count."""
    counter = flop_counter()
    with counter, torch.enable_grad():
        model(example[:1])
    return int(counter.get_total_flops())


@contextmanager
def ieee_float32() -> Iterator[None]:
    """Full float32 convolutions and matrix products inside, whatever the user chose outside:
    TF32's rounding alone would exceed :data:`TOLERANCE` (see docs/checkpoints.md)."""
    settings = (torch.backends.cudnn.conv, torch.backends.cuda.matmul)  # type: ignore[attr-defined]
    saved = [s.fp32_precision for s in settings]
    try:
        for s in settings:
            s.fp32_precision = "ieee"
        yield
    finally:
        for s, value in zip(settings, saved, strict=True):
            s.fp32_precision = value


@torch.no_grad()
def output_error(
    model: nn.Module,
    supernet: Supernet,
    task: int,
    inputs: list[Tensor],
    model_inputs: list[Tensor] | None = None,
) -> tuple[float, float]:
    """Largest absolute difference between ``model``'s outputs on ``model_inputs`` (default:
    ``inputs``; raw batches for a program with the task's transform) and task ``task``'s
    supernet outputs on ``inputs``, and the largest absolute supernet output (the scale the
    difference is judged against), both in full float32 (:func:`ieee_float32`)."""
    supernet.eval()
    diffs, scales = [], []
    with ieee_float32():
        for x, given in zip(inputs, model_inputs or inputs, strict=True):
            reference = supernet(x, task=task)
            diffs.append((model(given) - reference).abs().max())
            scales.append(reference.abs().max())
    # torch's max keeps a NaN (Python's max would drop it, and the check would pass)
    return float(torch.stack(diffs).max()), float(torch.stack(scales).max())


@torch.no_grad()
def float32_rounding(
    model: Callable[[Tensor], Tensor], wide: Callable[[Tensor], Tensor], inputs: list[Tensor]
) -> float:
    """Largest float32 rounding error of ``model`` on ``inputs``: its outputs against those of
    ``wide``, the same model in float64. A folded BatchNorm is allowed this on top of the
    tolerance (see docs/checkpoints.md); a wrong fold is wrong in float64 too."""
    worst = torch.zeros(())
    with ieee_float32():
        for x in inputs:
            exact = wide(x.double() if x.is_floating_point() else x)
            worst = torch.maximum(worst, (model(x).double() - exact).abs().max().cpu())
    return float(worst)


def _float64(supernet: Supernet) -> Callable[[Tensor], Tensor]:
    """The supernet's model on the task loaded now, computed in float64: its floating
    parameters and buffers converted for the call only (not a copy of the whole supernet),
    but for the weight masks: a float32 mask promotes exactly, so the product is the same."""
    masks = {f"{name}.weight_mask" for name in supernet.layers}
    tensors = chain(supernet.model.named_parameters(), supernet.model.named_buffers())
    state = {n: t.double() for n, t in tensors if t.is_floating_point() and n not in masks}
    return partial(functional_call, supernet.model, state)


def _check_error(
    task: int, diff: float, scale: float, what: str, hint: str = "", rounding: float = 0.0
) -> float:
    """The tolerance for outputs of ``scale`` (plus the measured float32 ``rounding`` of a
    model with BatchNorm folded, see :func:`float32_rounding`); raise if ``diff`` exceeds it
    or is not a number (outputs that are NaN or infinite cannot be checked)."""
    allowed = TOLERANCE * max(1.0, scale) + rounding
    if not diff <= allowed:
        raise ExportError(
            f"task {task}: {what} differs from the supernet by {diff:.3g} (allowed {allowed:.3g} "
            f"for outputs up to {scale:.3g}){hint}"
        )
    return allowed


@dataclass
class ExportReport:
    """What was written for a task and how it was checked."""

    task: int
    files: list[str]
    n_classes: int
    input_shape: list[int]
    flops: int
    analytic_flops: float
    dense_flops: float
    parameters: int
    max_abs_diff: float
    max_abs_output: float
    tolerance: float
    checked_samples: int
    batchnorm_folded: bool
    widths: dict[str, int] = field(default_factory=dict)
    #: what the program takes (raw or model inputs, dtype, shape, transform and its FLOPs)
    inputs: dict[str, Any] = field(default_factory=dict)


def exported(model: nn.Module, example: Tensor) -> torch.export.ExportedProgram:
    """``model`` captured by ``torch.export`` on ``example``, its batch dimension dynamic:
    once per export, for the ``.pt2`` file and the ONNX file alike. Non-strict capture runs
    ``forward`` as Python, where ``len(x)`` is a plain int that fixes the batch; such a model
    is captured strictly (TorchDynamo reads ``len(x)`` as the batch dimension)."""
    shapes = ({0: torch.export.Dim("batch")},)
    try:
        return torch.export.export(model, (example,), dynamic_shapes=shapes)
    except Exception as first:  # torch.export raises many kinds of errors
        try:
            return torch.export.export(model, (example,), dynamic_shapes=shapes, strict=True)
        except Exception:
            raise first from None


def _write_pt2(program: torch.export.ExportedProgram, path: Path) -> nn.Module:
    """Save ``program`` to ``path`` atomically; the module read back from the file."""
    buffer = io.BytesIO()  # saved through a buffer: the archive is named after the file
    torch.export.save(program, buffer)
    with atomic_target(path, keep_suffix=True) as tmp:
        tmp.write_bytes(buffer.getvalue())
    return load_exported(path)


def write_onnx(
    model: torch.export.ExportedProgram,
    example: Tensor,
    path: Path,
    outputs: tuple[str, ...] = ("logits",),
) -> None:
    """Write ``model`` (a program of :func:`exported`) as a checked ONNX file at ``path``,
    atomically, its outputs named ``outputs``."""
    import onnx

    with atomic_target(path, keep_suffix=True) as tmp:
        torch.onnx.export(
            model,
            (example,),
            str(tmp),
            dynamo=True,
            external_data=False,
            input_names=["input"],
            output_names=list(outputs),
            verbose=False,
        )
    onnx.checker.check_model(onnx.load(str(path)))


def _checked_slim(
    supernet: Supernet,
    task: int,
    inputs: list[Tensor],
    example: Tensor,
    fold_bn: bool,
    expected_flops: float | None,
) -> tuple[nn.Module, float, ExportReport]:
    """Task ``task``'s slim copy (BatchNorm folded with ``fold_bn``), refused unless its FLOPs
    are the supernet's count (and ``expected_flops``) and its outputs on ``inputs`` the
    supernet's within the tolerance; with the measured float32 rounding of both (BatchNorm
    folded, see :func:`float32_rounding`) and its report (files and inputs to fill in)."""
    slim = slim_copy(supernet, task, example)
    folded_bn = fold_bn and any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) for m in slim.modules()
    )
    rounding, wide = 0.0, None
    if folded_bn:
        # the supernet's own rounding: its sums run over other widths than the slim copy's
        rounding = float32_rounding(partial(supernet, task=task), _float64(supernet), inputs)
        wide = copy.deepcopy(slim).double()
        fold_batchnorm(wide, example.double() if example.is_floating_point() else example)
    if fold_bn:
        fold_batchnorm(slim, example)
    flops = measured_flops(slim, example)
    analytic = supernet.flops(supernet.masks[task].units)
    for counted, source in (
        (analytic, "the supernet counts"),
        (expected_flops, "results.json reports"),
    ):
        if counted is not None and flops != counted:
            raise ExportError(f"task {task}: slim model has {flops} FLOPs, {source} {counted}")
    diff, scale = output_error(slim, supernet, task, inputs)
    if wide is not None:
        rounding += float32_rounding(slim, wide, inputs)
    hint = "; try --keep-bn" if folded_bn else ""
    allowed = _check_error(task, diff, scale, "the slim model", hint, rounding)
    report = ExportReport(
        task=task,
        files=[],
        n_classes=supernet.masks[task].n_classes,
        input_shape=[],
        flops=flops,
        analytic_flops=analytic,
        dense_flops=supernet.dense_flops,
        parameters=sum(p.numel() for p in slim.parameters()),
        max_abs_diff=diff,
        max_abs_output=scale,
        tolerance=allowed,
        checked_samples=sum(len(x) for x in inputs),
        batchnorm_folded=fold_bn,
        widths={g: int(a.sum()) for g, a in supernet.masks[task].units.items()},
    )
    return slim, rounding, report


def check_request(out: Path | str, inputs: list[Tensor]) -> Path:
    """:func:`check_target`, and refuse no inputs to check on or ``.onnx`` without ONNX."""
    out = check_target(out)
    if not inputs:
        raise ExportError("export needs at least one batch of inputs to check the model on")
    if out.suffix == ".onnx" and not onnx_available():
        raise ExportError(
            "ONNX export needs the onnx and onnxscript packages: pip install espn[onnx]"
        )
    return out


def export_task(
    supernet: Supernet,
    task: int,
    inputs: list[Tensor],
    out: Path | str,
    also_onnx: bool | None = None,
    expected_flops: float | None = None,
    fold_bn: bool = True,
    transform: BatchTransform | None = None,
    overwrite: bool = False,
    run: Path | str | None = None,
) -> ExportReport:
    """Write task ``task`` as a slim standalone model to ``out`` (``.pt2`` or ``.onnx``; with a
    ``.pt2`` also the ``.onnx`` when ``also_onnx``, default: when available) and a ``.json``
    report beside it, checked against the supernet on ``inputs`` (within :data:`TOLERANCE`
    of the largest output) and its FLOPs (against ``expected_flops`` too, when given).
    With the task's ``transform``, ``inputs`` are raw batches and the program takes them raw
    (:mod:`espn.export.inputs`). ``fold_bn`` folds each BatchNorm into the layer before it.
    A run directory's own files are never replaced, other files only with ``overwrite``
    (:func:`check_not_replacing`)."""
    out = check_request(out, inputs)  # everything refused before any work
    if also_onnx is None:
        also_onnx = out.suffix == ".pt2" and onnx_available()
    check_not_replacing(export_files(out, also_onnx), overwrite, run)
    raw_inputs, transform = inputs, transform if has_transform(transform) else None
    if transform is not None:
        inputs = [transform(x, False) for x in raw_inputs]
    raw_example = raw_inputs[0][:2].clone()  # a view would save its whole storage
    example = inputs[0][:2].clone()
    slim, rounding, report = _checked_slim(supernet, task, inputs, example, fold_bn, expected_flops)
    program = slim if transform is None else WithInputs(transform, slim)
    report.input_shape = list(raw_example.shape[1:])
    report.inputs = {
        "raw": transform is not None,
        "dtype": str(raw_example.dtype).removeprefix("torch."),
        "shape": list(raw_example.shape[1:]),
        "model_input_shape": list(inputs[0].shape[1:]),
        "transform": describe_transform(transform),
        "transform_flops": measured_flops(program, raw_example) - report.flops,
    }

    def saved(loaded: nn.Module) -> float:
        return output_error(loaded, supernet, task, inputs, raw_inputs)[0]

    _write(program, raw_example, out, also_onnx, report, rounding, saved)
    with writing(out.with_suffix(".json")):
        write_json_atomic(out.with_suffix(".json"), asdict(report))
    return report


def _write(
    program: nn.Module,
    example: Tensor,
    out: Path,
    also_onnx: bool,
    report: ExportReport,
    rounding: float,
    saved: Callable[[nn.Module], float],
) -> None:
    """Capture ``program`` once and write it to ``out`` (and its ONNX file with
    ``also_onnx``); a ``.pt2`` is loaded back and checked (its outputs by ``saved``, its
    FLOPs). The files written and the largest output difference checked go into ``report``."""
    with writing(out.parent):
        out.parent.mkdir(parents=True, exist_ok=True)
    captured = exported(program, example)
    if out.suffix == ".onnx":
        with writing(out):
            write_onnx(captured, example, out)
        report.files = [str(out)]
        return
    with writing(out):
        loaded = _write_pt2(captured, out)
    saved_diff = saved(loaded)
    task, scale = report.task, report.max_abs_output
    _check_error(task, saved_diff, scale, "the saved model", rounding=rounding)
    if measured_flops(loaded, example) != report.flops + report.inputs["transform_flops"]:
        raise ExportError(f"task {task}: the saved program counts other FLOPs than the model")
    report.files = [str(out)]
    if also_onnx:
        with writing(out.with_suffix(".onnx")):
            write_onnx(captured, example, out.with_suffix(".onnx"))
        report.files.append(str(out.with_suffix(".onnx")))
    report.max_abs_diff = max(report.max_abs_diff, saved_diff)  # both checked: finite


def load_exported(path: Path | str) -> nn.Module:
    """Load a ``.pt2`` file written by :func:`export_task` (plain ``torch.export.load``)."""
    return torch.export.load(str(path)).module()
