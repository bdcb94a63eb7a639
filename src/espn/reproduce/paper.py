"""The paper's reported numbers (package data ``paper_numbers.json``) and what our runs used
instead of the paper's data, said in words."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from espn.reproduce.target import Run

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


def data_notes(runs: Iterable[Run], paper_model: str | None = None) -> list[str]:
    """Lines saying which benchmarks of ``runs`` stand in for the paper's data, and (given the
    paper's model) which models for the paper's."""
    runs = list(runs)
    notes = []
    for name in sorted({r.doc["benchmark"] for r in runs}):
        if name in STANDS_IN_FOR:
            notes.append(
                f"data: {name} (real Fashion-MNIST images, available offline) stands in for the "
                f"paper's {STANDS_IN_FOR[name]}, which is not on this machine; our numbers are "
                "not the paper's experiment and are compared in shape only"
            )
    other = sorted({r.doc["model"] for r in runs} - {paper_model}) if paper_model else []
    if other:
        notes.append(f"model: {', '.join(other)} instead of the paper's {paper_model} (CPU cost)")
    return notes


def claims_notes(target: str, ours: list[str]) -> list[str]:
    """The paper's reference and its stated findings, each followed by what our runs show."""
    entry = paper_numbers()[target]
    lines = [f"paper: {entry['ref']}"]
    if entry.get("numbers") is None and "methods" not in entry and "tasks" not in entry:
        lines.append("the paper gives this figure as curves only, no numbers: the plot shows ours")
    for i, claim in enumerate(entry.get("claims", [])):
        measured = ours[i] if i < len(ours) else "not measured here"
        lines.append(f"paper says: {claim}. Ours: {measured}")
    return lines
