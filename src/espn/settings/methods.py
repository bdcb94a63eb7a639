"""The options of espn's own methods, declared once as plain data (no torch): each method
class takes its ``options`` from :data:`METHOD_OPTIONS`, and the command line refuses a bad
flag or value before it loads a method or torch (docs/methods.md, "Adding a method")."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

from espn.settings.options import Option
from espn.settings.training import DEFAULTS, OPTIONS, SETTING_NAMES

#: what the FLOPs load of a unit counts (``espn.supernet.flops.FLOP_LOADS``, below this
#: package, is the same tuple: a test holds them equal)
FLOP_LOADS = ("output", "total")
#: which frozen weights a task keeps in its alive units
REUSE_POLICIES = ("all", "magnitude")
#: the unit pruners (``espn.pruning.pruner.PRUNERS`` registers one factory under each)
PRUNER_NAMES = ("flop-aware", "l1", "polarization")
#: the weight t of the polarization pruner's L1 term (the authors' code; Zhuang et al.: 1.2-1.5)
POLARIZATION_T = 1.2

#: a pruner's own settings by pruner name: options of the methods that prune units, passed
#: to the pruner's factory as keywords when it is chosen
PRUNER_OPTIONS: dict[str, tuple[Option, ...]] = {
    "polarization": (
        Option(
            "polarization_t",
            float,
            POLARIZATION_T,
            "weight t of the L1 term of the polarization pruner (Zhuang et al.: about 1.2 to 1.5)",
            low=0.0,
            low_open=True,
        ),
    )
}

#: the option of the methods that add the authors' L2 term on the masked weights to the loss
#: of every phase (CtRL ``manager.py``, ``manager_small.py``, ``PackNet_manager.py``: ``lam``,
#: default 1, the same ``lam`` as the sparsity penalty's)
MASKED_L2 = Option(
    "masked_l2",
    float,
    1.0,
    "strength of the L2 term ||w m||_2 / sqrt(nnz(m)) on the masked weights of the layers "
    "producing units (the head left out), added in every phase (authors: 1; 0: off)",
    low=0.0,
)
#: the option of the methods that re-initialise their free weights per task as CtRL does
FREE_INIT = Option(
    "free_init",
    str,
    "kaiming",
    "free weights at the start of each task after the first: kaiming (the authors' CtRL), "
    "zero, or keep (as the previous task left them)",
    choices=("kaiming", "zero", "keep"),
)
#: the options of a method that prunes units: its pruner, the pruner's penalty, FLOP load
#: and own settings, and which frozen weights a task reuses
UNIT_PRUNING = (
    Option(
        "pruner",
        str,
        "flop-aware",
        "unit pruner: " + ", ".join(PRUNER_NAMES),
        choices=PRUNER_NAMES,
    ),
    Option(
        "penalty",
        float,
        1.0,
        "strength of the pruner's penalty, averaged over alive units (authors: 1)",
        low=0.0,
    ),
    Option(
        "flop_load",
        str,
        "output",
        "FLOP load of a unit for the FLOP-aware penalty: output (the paper: the cost of "
        "computing it) or total (also the cost of its outgoing connections)",
        choices=FLOP_LOADS,
    ),
    Option(
        "stream_pruning",
        str,
        DEFAULTS.stream_pruning,
        "residual streams of espn's ResNets: per-conv (the authors' CtRL: each conv writing "
        "into a stream pruned on its own, a stream channel alive where any keeps it) or "
        "coupled (one unit group per stream, all its writers keep or drop a channel together)",
        choices=OPTIONS["stream_pruning"].choices,
    ),
    Option(
        "reuse",
        str,
        "all",
        "frozen weights a task keeps: all in its alive units (the paper) or magnitude",
        choices=REUSE_POLICIES,
    ),
    *(option for options in PRUNER_OPTIONS.values() for option in options),
)

#: the options of each of espn's methods, by method name (a method not named here declares
#: none, or its own in its class: ``Strategy.options``)
METHOD_OPTIONS: dict[str, tuple[Option, ...]] = {
    "espn": (*UNIT_PRUNING, MASKED_L2, FREE_INIT),
    "individual": (*UNIT_PRUNING, MASKED_L2),
    "packnet": (
        FREE_INIT,
        MASKED_L2,
        Option(
            "packnet_prune",
            str,
            "gradual",
            "weight pruning: gradual over the pruning epochs (the authors' baseline) or "
            "one-shot after them",
            choices=("gradual", "one-shot"),
        ),
    ),
    "cpg": (
        Option(
            "cpg_acc_loss",
            float,
            0.0,
            "accuracy points below the task's accuracy after training that a compacting round "
            "may be and still reach the goal",
            low=0.0,
            high=100.0,
            unit="accuracy points",
        ),
        Option(
            "cpg_stop",
            str,
            "reference",
            "when compacting stops: reference (continue while a round's training accuracy "
            "exceeds cpg_train_acc, keep the largest sparsity reaching the goal) or goal (stop "
            "at the first round below the goal and undo it)",
            choices=("reference", "goal"),
        ),
        Option(
            "cpg_train_acc",
            float,
            95.0,
            "the reference stop rule: compacting continues while a round's training accuracy "
            "exceeds this",
            low=0.0,
            high=100.0,
            unit="%",
        ),
        Option(
            "cpg_mask_lr",
            float,
            5e-4,
            "learning rate of the picking masks (Adam)",
            low=0.0,
            low_open=True,
        ),
        Option(
            "cpg_zero_released",
            bool,
            True,
            "zero the weights a task's compacting releases (the reference); false keeps their "
            "values for the next task",
        ),
    ),
    "rmn": (
        Option("rmn_l1", float, 1e-6, "L1 strength on the relevance maps", low=0.0),
        Option(
            "rmn_threshold",
            float,
            0.5,
            "without a budget (the paper), a weight stays in the task where its |relevance| "
            "exceeds this (relevances start at 1)",
            low=0.0,
        ),
        Option(
            "rmn_budget",
            float,
            0.0,
            "espn's weight allocation: keep the floor(B x free) free weights of largest "
            "relevance per layer (0: none, the paper's threshold rule)",
            low=0.0,
            high=1.0,
        ),
        Option(
            "rmn_frozen_map",
            str,
            "binary",
            "how frozen weights enter training: through the binary map they keep, with a "
            "straight-through gradient (binary), or scaled by the real-valued relevance (soft, "
            "espn before)",
            choices=("binary", "soft"),
        ),
    ),
    "supsup": (
        Option(
            "supsup_k",
            float,
            0.5,
            "fraction of each layer's weights in a supermask",
            low=0.0,
            low_open=True,
            high=1.0,
        ),
        Option("supsup_lr", float, 1e-3, "learning rate of the scores", low=0.0, low_open=True),
        Option(
            "supsup_head",
            str,
            "masked",
            "a task's head: masked (signed constants under a supermask, the reference) or "
            "dense (trained with a bias)",
            choices=("masked", "dense"),
        ),
        Option(
            "supsup_density",
            str,
            "erdos-renyi",
            "how supsup_k spreads over the layers: erdos-renyi (the reference's er_sparsity: "
            "min(0.5, s(c_in+c_out)/(c_in c_out k^2)) per layer, s solved for the total; needs "
            "supsup_k <= 0.5) or uniform (supsup_k in every layer)",
            choices=("erdos-renyi", "uniform"),
        ),
        Option(
            "supsup_scale",
            str,
            "fan-in",
            "the signed constants: fan-in (+-sqrt(2/fan_in), the reference) or density "
            "(+-sqrt(2/(d fan_in)) for a layer of supermask density d)",
            choices=("fan-in", "density"),
        ),
    ),
}


def declared(methods: Mapping[str, Iterable[Option]]) -> dict[str, tuple[Option, list[str]]]:
    """Every option the ``methods`` (name -> options) declare: name -> (declaration, its
    methods).

    Two methods may share an option only with the same declaration (a subclass inherits
    its parent's); an option may not be named like a training setting
    (:class:`~espn.settings.training.TrainingSettings`) unless it is that setting, declared
    with its one default (``stream_pruning``).
    """
    found: dict[str, tuple[Option, list[str]]] = {}
    for method, options in methods.items():
        for option in options:
            if option.name in SETTING_NAMES and option.default != getattr(DEFAULTS, option.name):
                raise ValueError(
                    f"method {method!r} declares option {option.name!r}, which is a general "
                    "setting of every method; give it another name"
                )
            first = found.setdefault(option.name, (option, []))
            if first[0] != option:
                raise ValueError(
                    f"methods {first[1][0]!r} and {method!r} declare option {option.name!r} "
                    "differently; give one of them another name"
                )
            first[1].append(method)
    return found


def known_options() -> dict[str, tuple[Option, list[str]]]:
    """The options of the methods this process knows: those of every registered method once
    the methods are loaded (one a plugin or a test registered included), else espn's own
    from :data:`METHOD_OPTIONS`, without loading a method (nor torch)."""
    base: Any = sys.modules.get("espn.methods.base")
    return base.declared_options() if base is not None else declared(METHOD_OPTIONS)


def resolve_settings(
    method: str,
    options: Iterable[Option],
    given: Mapping[str, Any],
) -> dict[str, Any]:
    """The settings of ``method`` from the ``given`` values (None: unset), checked against its
    declared ``options`` and completed with their defaults, in declaration order; a setting
    of another method (:func:`known_options`) is refused with a message naming its method.
    """
    own = {o.name: o for o in options}
    owners = {n: m for n, (_, m) in known_options().items() if n not in own}
    for name, value in given.items():
        if name in own or value is None:
            continue
        if name in owners:
            whose = ", ".join(repr(m) for m in owners[name])
            raise ValueError(
                f"{name} applies to method{'s' * (len(owners[name]) > 1)} {whose} only, "
                f"not {method!r}; leave it unset"
            )
        accepted = ", ".join(own) or "none (it has no options of its own)"
        raise ValueError(f"unknown option {name!r} of method {method!r}; its options: {accepted}")
    return {
        name: option.default if given.get(name) is None else option.check(given[name])
        for name, option in own.items()
    }
