"""Figures of the theory lab, drawn from the CSV rows (Agg backend, written atomically)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from espn.theory.common import band
from espn.utils.plotting import pyplot, write_figure

#: per training order: its line style, colour and label
ORDER_STYLES = {
    "decreasing": ("-", "C0", "decreasing N (large first)"),
    "increasing": ("--", "C3", "increasing N (small first)"),
    "individual": (":", "C2", "individual (from scratch)"),
}


def _band(rows: Sequence[dict[str, Any]], x: str, y: str = "excess_risk") -> list[list[float]]:
    """[x, mean, min, max] of ``y`` over replicates at each ``x``, as four columns."""
    return [list(column) for column in zip(*band(rows, x, y), strict=True)]


def plot_sample_complexity(
    rows: Sequence[dict[str, Any]], summary: dict[str, Any], path: Path
) -> Path:
    """Left: excess risk vs N*T per setting (band: min..max over replicates) with the
    prediction ``c * dof / (N*T)``; right: against ``N*T / dof``, where the curves collapse
    if ``dof`` measures the complexity."""
    plt = pyplot()
    c, target = summary["rate_constant"], summary["target"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, s in enumerate(summary["settings"]):
        group = [r for r in rows if int(r["r_frz"]) == s["r_frz"]]
        xs, ys, lo, hi = _band(group, "NT")
        color = f"C{i}"
        label = f"{s['setting']} (r_new={s['r_new']}, dof={s['dof']:.0f})"
        ax.plot(xs, ys, "o-", color=color, label=label)
        ax.fill_between(xs, lo, hi, color=color, alpha=0.15)
        if math.isfinite(c):
            ax.plot(xs, [c * s["dof"] / x for x in xs], "--", color=color, alpha=0.8)
        ax2.plot([x / s["dof"] for x in xs], ys, "o-", color=color, label=label)
        if s["nt_needed"] is not None:
            ax.plot([s["nt_needed"]], [target], "*", color=color, markersize=13)
    ax.axhline(target, color="grey", lw=0.8, ls=":")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="total samples N*T",
        ylabel="excess test risk  (risk - E[Z^2])",
        title=f"measured (solid) vs c*dof/(NT) (dashed, c={c:.3g}); * = reaches {target:g}",
    )
    ax.legend(fontsize=8)
    if math.isfinite(c):
        lo_x = min(float(r["NT"]) / float(r["dof"]) for r in rows)
        hi_x = max(float(r["NT"]) / float(r["dof"]) for r in rows)
        grid = [lo_x * (hi_x / lo_x) ** (k / 40) for k in range(41)]
        ax2.plot(grid, [c / g for g in grid], "k--", lw=1, label="c / (NT/dof)")
    ax2.axhline(target, color="grey", lw=0.8, ls=":")
    ax2.set(
        xscale="log",
        yscale="log",
        xlabel="N*T / dof,   dof = T*r + r_new*d",
        ylabel="excess test risk",
        title="excess risk against N*T rescaled by dof",
    )
    ax2.legend(fontsize=8)
    fig.suptitle("Sample complexity of CRL: frozen features vs learning from scratch")
    return write_figure(fig, path, dpi=130, bbox_inches="tight")


def plot_mismatch(rows: Sequence[dict[str, Any]], summary: dict[str, Any], path: Path) -> Path:
    """Test risk (left, with ``E[Z^2]`` and the levels ``E[Z^2] + MM``) and excess risk (right,
    log axes, MM dashed) vs N*T for each perturbation; scratch in black."""
    plt = pyplot()
    noise = summary["noise_floor"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, p in enumerate(summary["perturbations"]):
        eps, color = p["perturbation"], f"C{i}"
        group = [r for r in rows if r["setting"] == "frozen" and float(r["perturbation"]) == eps]
        xs, test, _, _ = _band(group, "NT", "test_risk")
        _, ex, lo, hi = _band(group, "NT")
        mm = f"{p['mm_test']:.2g}" if p["mm_test"] > 1e-6 else "~0"
        label = f"frozen, eps={eps:g} (MM={mm})"
        ax.plot(xs, test, "o-", color=color, label=label)
        ax.axhline(noise + p["mm_test"], color=color, ls="--", lw=1)
        ax2.plot(xs, ex, "o-", color=color, label=label)
        ax2.fill_between(xs, lo, hi, color=color, alpha=0.15)
        if p["mm_test"] > 1e-6:  # eps = 0 gives MM ~ 1e-13: nothing to draw
            ax2.axhline(p["mm_test"], color=color, ls="--", lw=1)
    scratch = [r for r in rows if r["setting"] == "scratch"]
    if scratch:
        xs, test, _, _ = _band(scratch, "NT", "test_risk")
        _, ex, lo, hi = _band(scratch, "NT")
        ax.plot(xs, test, "s-", color="black", label="from scratch")
        ax2.plot(xs, ex, "s-", color="black", label="from scratch")
        ax2.fill_between(xs, lo, hi, color="black", alpha=0.1)
    ax.axhline(noise, color="grey", lw=1.5, ls=":", label=f"noise floor E[Z^2]={noise:.3g}")
    top = max(float(r["test_risk"]) for r in rows if r["setting"] in ("frozen", "scratch"))
    ax.set(
        xscale="log",
        ylim=(noise * 0.9, min(top, noise + 0.25) * 1.05),
        xlabel="total samples N*T",
        ylabel="test risk",
        title="test risk; dashed: E[Z^2] + MM",
    )
    ax.legend(fontsize=8)
    ax2.set(
        xscale="log",
        yscale="log",
        xlabel="total samples N*T",
        ylabel="excess test risk (risk - E[Z^2])",
        title="excess risk; dashed: MM (large noise-free solve)",
    )
    ax2.legend(fontsize=8)
    fig.suptitle("Representation mismatch: perturbed frozen features")
    return write_figure(fig, path, dpi=130, bbox_inches="tight")


def plot_task_order(rows: Sequence[dict[str, Any]], summary: dict[str, Any], path: Path) -> Path:
    """Excess risk per task ID (0: most samples) for each training order (solid: largest
    first; dashed: smallest first; dotted: each alone from scratch)."""
    plt = pyplot()
    ids, sizes = summary["task_ids"], summary["sizes"]
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    for o in summary["orders"]:
        order = o["order"]
        group = [r for r in rows if r["order"] == order]
        xs, ys, lo, hi = _band(group, "task_id")
        style, color, name = ORDER_STYLES[order]
        label = f"{name}: avg {o['average_excess']:.3g}"
        ax.plot(xs, ys, style, marker="o", label=label, color=color)
        ax.fill_between(xs, lo, hi, color=color, alpha=0.1)
    ax.set_xticks(ids, [f"{i}\nN={n}" for i, n in zip(ids, sizes, strict=True)], fontsize=7)
    ax.set(
        yscale="log",
        xlabel="task ID, from 0 (sorted by per-head sample size)",
        ylabel="excess test risk",
        title="Sequential CRL: excess risk per task ID for each training order",
    )
    ax.legend(fontsize=8)
    return write_figure(fig, path, dpi=130, bbox_inches="tight")
