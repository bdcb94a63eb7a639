"""Configurations saved by an older espn, completed so that they reproduce what it did."""

from __future__ import annotations

import json
from typing import Any

from espn.methods.base import METHODS, declared_options
from espn.runs.config import gather_method_options
from espn.settings.training import SETTING_NAMES, default

#: what runs recorded before an option existed behaved as, where that is not the option's
#: default (a training setting newer than a manifest ran at its declared default)
LEGACY_DEFAULTS: dict[str, Any] = {
    "task_affine": True,
    "flop_load": "total",
    "task_seed": None,
    "class_order": None,
    "init_weights": None,
}
#: run options that became ESPN's own (``method_options``); older configurations have them
#: at the top level, also for methods that never read them
MOVED_TO_METHOD = ("pruner", "penalty", "flop_load", "reuse")
#: what methods did before their recipes became their references' (configurations saved
#: with the moved options at the top level are from then)
LEGACY_METHOD_OPTIONS: dict[str, Any] = {
    "free_init": "keep",
    "packnet_prune": "one-shot",
    "supsup_head": "dense",
    "cpg_zero_released": False,
}
#: method options newer than some saved configurations, with what runs made before them did
#: (applied to any configuration without them, whatever its era)
ADDED_METHOD_OPTIONS: dict[str, Any] = {
    "stream_pruning": "coupled",
    "masked_l2": 0.0,
    "supsup_density": "uniform",
    "supsup_scale": "density",
    "cpg_stop": "goal",
}


def upgrade_saved_config(values: dict[str, Any]) -> dict[str, Any]:
    """A configuration saved by an older espn, completed with the values that reproduce what
    it did: method options recorded flat move into ``method_options``, completed with what
    they were then (:data:`LEGACY_METHOD_OPTIONS`, :data:`ADDED_METHOD_OPTIONS`) or their
    defaults."""
    values = dict(values)
    declared = declared_options()
    flat_era = any(k in values for k in declared)  # saved before options were the methods'
    newer = {  # as a manifest holds them (JSON: a tuple is a list)
        k: json.loads(json.dumps(default(k)))
        for k in SETTING_NAMES
        if k not in declared and k != "method_options"
    }
    legacy = {
        k: v
        for k, v in (newer | LEGACY_DEFAULTS).items()
        if k not in values and (flat_era or k not in MOVED_TO_METHOD)
    }
    upgraded = legacy | values
    if "finetune_lr" not in values:
        upgraded["finetune_lr"] = values.get("lr")
    method = values.get("method", "espn")
    if method not in METHODS:
        return gather_method_options(upgraded)
    strategy = METHODS.get(method)
    own = strategy.option_names()  # another method's (ESPN's options in a PackNet run): dropped
    upgraded = gather_method_options(
        {k: v for k, v in upgraded.items() if k not in declared or k in own}
    )
    given = dict(upgraded.get("method_options") or {})
    then = (LEGACY_METHOD_OPTIONS if flat_era else {}) | ADDED_METHOD_OPTIONS
    if method == "rmn" and "rmn_budget" not in given:  # alpha was RMN's weight allocation
        then = then | {"rmn_budget": upgraded.get("alpha") or 0.0}
        upgraded["alpha"] = 1.0
    upgraded["method_options"] = {
        o.name: given.get(o.name, then.get(o.name, o.default)) for o in strategy.options
    } | {k: v for k, v in given.items() if k not in own}  # unknown ones: refused on use
    return upgraded
