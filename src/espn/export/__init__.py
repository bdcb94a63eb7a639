"""Standalone per-task models: plain and slim copies of a sub-network, and their export."""

from espn.export.export import ExportReport, export_task, load_exported, onnx_available
from espn.export.slim import ExportError, fold_batchnorm, plain_copy, slim_copy

__all__ = [
    "ExportError",
    "ExportReport",
    "export_task",
    "fold_batchnorm",
    "load_exported",
    "onnx_available",
    "plain_copy",
    "slim_copy",
]
