"""The paper's reported numbers (package data ``paper_numbers.json``) and what our runs used
instead of the paper's data, said in words."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

#: the data a run on a stand-in benchmark replaces
STANDS_IN_FOR = {
    "split-fashion-mnist": "SplitCIFAR100",
    "fashion-mnist": "CIFAR-10",
    "rotated-fashion-mnist": "RotatedMNIST",
    "permuted-fashion-mnist": "PermutedMNIST",
}


@functools.cache
def paper_numbers() -> dict[str, Any]:
    """Every number the paper reports, by target, with its table/figure reference."""
    text = resources.files(__package__).joinpath("paper_numbers.json").read_text()
    return json.loads(text)


def paper(target: str) -> dict[str, Any]:
    """The paper's entry for ``target``: ``ref``, and ``numbers``/``methods``/``tasks``
    where the paper gives numbers, ``claims`` where it states findings in words."""
    return paper_numbers()[target]


def data_notes(benchmarks: Iterable[str], models: Iterable[str], paper_model: str) -> list[str]:
    """Lines saying which benchmarks and models stand in for the paper's."""
    notes = []
    for name in sorted(set(benchmarks)):
        if name in STANDS_IN_FOR:
            notes.append(
                f"data: {name} (real Fashion-MNIST images, available offline) stands in for the "
                f"paper's {STANDS_IN_FOR[name]}, which is not on this machine; our numbers are "
                "not the paper's experiment and are compared in shape only"
            )
    other = sorted(set(models) - {paper_model})
    if other:
        notes.append(f"model: {', '.join(other)} instead of the paper's {paper_model} (CPU cost)")
    return notes


def claims_notes(target: str, ours: list[str]) -> list[str]:
    """The paper's reference and its stated findings, each followed by what our runs show."""
    entry = paper(target)
    lines = [f"paper: {entry['ref']}"]
    if entry.get("numbers") is None and "methods" not in entry and "tasks" not in entry:
        lines.append("the paper gives this figure as curves only, no numbers: the plot shows ours")
    for i, claim in enumerate(entry.get("claims", [])):
        measured = ours[i] if i < len(ours) else "not measured here"
        lines.append(f"paper says: {claim}. Ours: {measured}")
    return lines
