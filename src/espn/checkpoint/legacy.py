"""Configurations saved by an older espn, completed so that they reproduce what it did."""

from __future__ import annotations

from typing import Any

from espn.config import gather_method_options

#: what runs recorded before an option existed behaved as (read from older manifests)
LEGACY_DEFAULTS: dict[str, Any] = {
    "task_affine": True,
    "flop_load": "total",
    "warmup": 0,
    "finetune_schedule": "cosine",
    "task_seed": None,
    "class_order": None,
    "init_weights": None,
}


def upgrade_saved_config(values: dict[str, Any]) -> dict[str, Any]:
    """A configuration saved by an older espn, completed with the values that reproduce what
    that espn did (its fine-tuning started from the run's learning rate); method options it
    recorded flat (``supsup_k``, unset ones as null) move into ``method_options``."""
    upgraded = {k: v for k, v in LEGACY_DEFAULTS.items() if k not in values} | dict(values)
    if "finetune_lr" not in values:
        upgraded["finetune_lr"] = values.get("lr")
    return gather_method_options(upgraded)
