"""Sample complexity: excess risk against ``N*T`` with frozen features (several ``r_frz``)
and from scratch; the paper's Corollary 1 says the excess risk is governed by
``dof / (N*T)`` with ``dof = T*r + r_new*d``."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from statistics import mean
from typing import Any

from espn.theory.common import Progress, mean_curve, replicate, risk_curve
from espn.theory.config import SampleComplexityConfig


def run_sample_complexity(
    cfg: SampleComplexityConfig, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """Solve CRL for every replicate, setting (scratch / each ``r_frz``) and ``N``; within a
    replicate the settings share the model, test set and nested training sets (paired)."""
    cfg.validate()
    rows: list[dict[str, Any]] = []
    for rep in range(cfg.replicates):
        data = replicate(cfg, rep, max(cfg.ns))
        for r_frz in cfg.settings:
            setting = "scratch" if r_frz == 0 else "frozen"
            seed = (cfg.seed, rep, r_frz)
            W_frz = data[0].frozen(r_frz)
            rows += risk_curve(cfg, rep, data, setting, W_frz, cfg.r - r_frz, seed, progress)
    return rows


def crossing(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """First ``x`` where the curve reaches ``target`` (log-log interpolation; the first ``x``
    if it starts there), else None."""
    for i, (x, y) in enumerate(curve):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = curve[i - 1]
            if y0 <= 0 or y <= 0 or y0 == y:
                return x
            frac = (math.log(y0) - math.log(target)) / (math.log(y0) - math.log(y))
            return math.exp(math.log(x0) + frac * (math.log(x) - math.log(x0)))
    return None


def fit_rate_constant(rows: Iterable[dict[str, Any]]) -> float:
    """``c`` of ``excess ~ c * dof / (N*T)``, one for all settings, fitted in log space over
    the points with ``N*T >= dof`` (below that the problem is under-determined)."""
    logs = [
        math.log(float(r["excess_risk"])) - math.log(float(r["dof"]) / float(r["NT"]))
        for r in rows
        if float(r["NT"]) >= float(r["dof"]) and float(r["excess_risk"]) > 0
    ]
    return math.exp(mean(logs)) if logs else float("nan")


def summarize_sample_complexity(
    rows: Sequence[dict[str, Any]], target: float = 0.01
) -> dict[str, Any]:
    """N*T needed to reach ``target`` excess risk per setting, against the bound's
    constant-free prediction ``NT_scratch / NT_frozen = dof_scratch / dof_frozen``."""

    c = fit_rate_constant(rows)
    by_setting: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_setting[int(row["r_frz"])].append(row)
    settings: list[dict[str, Any]] = []
    for r_frz in sorted(by_setting):
        group = by_setting[r_frz]
        curve = mean_curve(group, "NT")
        dof = float(group[0]["dof"])
        settings.append(
            {
                "setting": "scratch" if r_frz == 0 else f"frozen r_frz={r_frz}",
                "r_frz": r_frz,
                "r_new": int(group[0]["r_new"]),
                "dof": dof,
                "nt_needed": crossing(curve, target),
                "nt_predicted": c * dof / target,
                "excess_at_max_nt": curve[-1][1],
                "max_nt": curve[-1][0],
            }
        )
    scratch = next((s for s in settings if s["r_frz"] == 0), None)
    for s in settings:
        if scratch is None:
            s["ratio_measured"] = s["ratio_predicted"] = s["excess_ratio_at_max_nt"] = None
            continue
        s["ratio_predicted"] = scratch["dof"] / s["dof"]
        both = scratch["nt_needed"] is not None and s["nt_needed"] is not None
        s["ratio_measured"] = scratch["nt_needed"] / s["nt_needed"] if both else None
        # at a fixed N*T in the asymptotic regime the bound says excess is ~ dof
        same_nt = scratch["max_nt"] == s["max_nt"] and s["excess_at_max_nt"] > 0
        s["excess_ratio_at_max_nt"] = (
            scratch["excess_at_max_nt"] / s["excess_at_max_nt"] if same_nt else None
        )
    return {"target": target, "rate_constant": c, "settings": settings}
