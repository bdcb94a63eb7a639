"""Plots of a run: final per-task accuracy and per-task FLOPs ratio."""

from __future__ import annotations

from pathlib import Path

from espn.utils.plotting import pyplot, write_figure


def plot_run(results: dict, path: Path) -> None:
    """Two panels: accuracy of each task after the last task, and each task's FLOPs ratio."""
    plt = pyplot()
    final = results["final_accuracy"]
    ratios = results["flops_ratio"]
    tasks = list(range(len(final)))  # numbered from 0, as everywhere in espn
    fig, (ax_acc, ax_flops) = plt.subplots(1, 2, figsize=(11, 4))
    label = f"{results['method']} (gamma={results['gamma']}, alpha={results['alpha']})"
    ax_acc.bar(tasks, final, color="tab:blue")
    ax_acc.axhline(results["average_accuracy"], color="k", ls="--", lw=1, label="average")
    ax_acc.set(xlabel="task (from 0)", ylabel="test accuracy after the last task (%)", title=label)
    ax_acc.set_xticks(tasks)
    ax_acc.set_ylim(0, 100)
    ax_acc.legend(loc="lower right")
    ax_flops.bar(tasks, ratios, color="tab:orange")
    ax_flops.axhline(results["gamma"], color="k", ls="--", lw=1, label="gamma")
    ax_flops.set(xlabel="task (from 0)", ylabel="FLOPs / dense FLOPs", title=results["benchmark"])
    ax_flops.set_xticks(tasks)
    ax_flops.set_ylim(0, 1.05)
    ax_flops.legend(loc="upper right")
    write_figure(fig, path)
