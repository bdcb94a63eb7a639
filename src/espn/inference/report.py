"""A run's task-agnostic figures in its ``results.json`` and as a task-confusion plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from espn.evaluation.results import RESULTS, read_results
from espn.utils.io import write_json_atomic
from espn.utils.plotting import pyplot, write_figure

#: the key of results.json holding what ``espn evaluate --task-agnostic`` measured
KEY = "task_agnostic"


def plot_name(rule: str) -> str:
    """The file name of a rule's task-confusion plot, written beside results.json."""
    return f"task_confusion-{rule}.png"


def store(run: Path, doc: dict[str, Any]) -> bool:
    """Put ``doc`` (see :func:`espn.inference.evaluate_task_agnostic`) under
    ``results.json[KEY][rule]`` of run ``run`` (atomically; other rules' entries kept); False
    when the run has no results.json."""
    results = read_results(run)
    if results is None:
        return False
    results[KEY] = stored(results) | {doc["rule"]: doc}
    write_json_atomic(run / RESULTS, results)
    return True


def stored(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The task-agnostic entries of a results.json document, by rule (none: empty)."""
    entries = results.get(KEY)
    return entries if isinstance(entries, dict) else {}


def plot_confusion(doc: dict[str, Any], path: Path, names: list[str] | None = None) -> None:
    """The task-confusion matrix of ``doc``: per true task (row), the share of its test
    samples each task (column) was picked for, in percent."""
    plt = pyplot()
    counts = doc["confusion"]
    n = len(counts)
    shares = [[100.0 * c / max(sum(row), 1) for c in row] for row in counts]
    fig, ax = plt.subplots(figsize=(4.5 + 0.45 * n, 2.0 + 0.45 * n))
    image = ax.imshow(shares, vmin=0, vmax=100, cmap="Blues")
    ax.set(
        xlabel="task picked",
        ylabel="true task",
        xticks=range(n),
        yticks=range(n),
        title=f"rule {doc['rule']}\ntask picked right for "
        f"{doc['average']['task_picked']:.1f}% of the samples",
    )
    if names is not None and n <= 12:
        ax.set_yticks(range(n), [f"{j}: {name}" for j, name in enumerate(names)])
    if n <= 12:
        for i in range(n):
            for j in range(n):
                color = "white" if shares[i][j] > 50 else "black"
                ax.text(j, i, f"{shares[i][j]:.0f}", ha="center", va="center", color=color)
    fig.colorbar(image, ax=ax, label="% of the true task's test samples")
    write_figure(fig, path)
