"""Mismatch: a perturbed ``W_frz``. The excess risk levels off at the mismatch
``MM = L*_frz - L*`` (measured by a separate large-sample solve on clean labels) instead of
going to 0; learning from scratch eventually goes below it."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from statistics import mean
from typing import Any

from espn.theory.common import (
    Progress,
    curve_row,
    evaluate,
    mean_curve,
    replicate,
    risk_curve,
    solver_config,
    tick,
)
from espn.theory.config import MismatchConfig
from espn.theory.planted import derive_seed, generator
from espn.theory.solver import solve_crl


def run_mismatch(cfg: MismatchConfig, progress: Progress | None = None) -> list[dict[str, Any]]:
    """Frozen rows perturbed by each ``eps``: risk curves and the mismatch MM = L*_frz - L*,
    solved on ``mm_n`` clean samples per task (``mm-train``: in-sample, a slight
    under-estimate; ``mm-test``: on the clean test set, a slight over-estimate)."""
    cfg.validate()
    rows: list[dict[str, Any]] = []
    r_new = cfg.learned_rows
    for rep in range(cfg.replicates):
        data = replicate(cfg, rep, max(cfg.ns))
        model, _, test, test_clean = data
        for eps in cfg.perturbations:
            W_frz = model.frozen(cfg.r_frz, eps, seed=derive_seed(cfg.seed, "perturb", rep))
            # the mismatch: a large noise-free solve on top of the perturbed rows
            start = time.perf_counter()
            _, mm_clean = model.sample(cfg.mm_n, generator(cfg.seed, "mm", rep, eps))
            sol = solve_crl(
                mm_clean, r_new, W_frz, solver_config(cfg, model, derive_seed(rep, eps))
            )
            _, mm_test = evaluate(sol.predict, list(range(model.T)), test, test_clean)
            for setting, value in (("mm-train", sol.train_loss), ("mm-test", mm_test)):
                risks = (value + model.noise_floor, value)
                solve = (setting, cfg.r_frz, r_new, cfg.mm_n, sol.train_loss, risks, start)
                rows.append(curve_row(cfg, model, rep, *solve) | {"perturbation": eps})
            tick(progress)
            seed = (cfg.seed, rep, "frozen", eps)
            curve = risk_curve(cfg, rep, data, "frozen", W_frz, r_new, seed, progress)
            rows += [row | {"perturbation": eps} for row in curve]
        if cfg.include_scratch:
            seed = (cfg.seed, rep, "scratch", math.nan)
            curve = risk_curve(cfg, rep, data, "scratch", None, cfg.r, seed, progress)
            rows += [row | {"perturbation": math.nan} for row in curve]
    return rows


def summarize_mismatch(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per perturbation: MM (mean over replicates) next to the floor, the frozen excess risk
    at the largest ``N*T`` (which the theory says approaches MM from above)."""

    out = []
    perts = sorted({float(r["perturbation"]) for r in rows if r["setting"] == "frozen"})
    for eps in perts:

        def pick(setting: str, eps: float = eps) -> list[dict[str, Any]]:
            return [r for r in rows if r["setting"] == setting and float(r["perturbation"]) == eps]

        curve = mean_curve(pick("frozen"), "NT")
        mm_test = mean(float(r["excess_risk"]) for r in pick("mm-test"))
        mm_train = mean(float(r["excess_risk"]) for r in pick("mm-train"))
        out.append(
            {
                "perturbation": eps,
                "mm_train": mm_train,
                "mm_test": mm_test,
                "floor": curve[-1][1],
                "min_excess": min(y for _, y in curve),
                "floor_over_mm": curve[-1][1] / mm_test if mm_test > 1e-6 else None,
                "max_nt": curve[-1][0],
            }
        )
    scratch = [r for r in rows if r["setting"] == "scratch"]
    scratch_curve = mean_curve(scratch, "NT") if scratch else []
    noise = mean(float(r["noise_floor"]) for r in rows)
    return {
        "noise_floor": noise,
        "perturbations": out,
        "scratch_at_max_nt": scratch_curve[-1][1] if scratch_curve else None,
        "scratch_curve": scratch_curve,
    }
