"""What espn knows by name, from Python: the names ``espn list`` prints, in registration order,
that ``--benchmark``, ``--model``, ``--method`` and ``--pruner`` (and their keywords) accept."""

from __future__ import annotations


def list_benchmarks() -> list[str]:
    """The benchmark names (``--benchmark``), e.g. ``"permuted-fashion-mnist"``."""
    from espn.data import BENCHMARKS

    return BENCHMARKS.names()


def list_models() -> list[str]:
    """The model names (``--model``), entry-point models included."""
    from espn.models import MODELS

    return MODELS.names()


def list_methods() -> list[str]:
    """The method names (``--method``, :func:`espn.create_method`), e.g. ``"espn"``."""
    from espn.methods import METHODS

    return METHODS.names()


def list_pruners() -> list[str]:
    """The unit pruner names (``--pruner`` of ``espn`` and ``individual``)."""
    from espn.pruning import PRUNERS

    return PRUNERS.names()
