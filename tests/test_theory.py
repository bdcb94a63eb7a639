"""Theory lab: planted model, CRL solver (joint and sequential), summaries.

Small sizes and fixed seeds; every check here can fail if the maths or the solver
is wrong (e.g. a solver that ignores the data, or frozen rows that move).
"""

from __future__ import annotations

import math

import pytest
import torch

from espn.theory.common import evaluate
from espn.theory.config import SampleComplexityConfig, TaskOrderConfig, TheoryConfigError
from espn.theory.mismatch import summarize_mismatch
from espn.theory.planted import PlantedModel, generator
from espn.theory.sample_complexity import (
    crossing,
    fit_rate_constant,
    run_sample_complexity,
    summarize_sample_complexity,
)
from espn.theory.solver import SolverConfig, solve_crl, solve_sequential
from espn.theory.task_order import summarize_task_order


def excess(model: PlantedModel, predict, n_test: int = 1000, seed: int = 99) -> float:
    test, clean = model.sample(n_test, generator("test", seed))
    return evaluate(predict, list(range(model.T)), test, clean)[1]


def bounds(model: PlantedModel, activation: str, **kw) -> SolverConfig:
    return SolverConfig(
        activation=activation,
        head_bound=1.5 * float(model.V.norm(dim=1).max()),
        rep_bound=1.5 * float(model.W.norm()),
        **kw,
    )


# ----------------------------------------------------------------------------- planted model


def test_planted_model_shapes_noise_and_frozen_rows():
    model = PlantedModel.create(12, 3, 4, activation="relu", noise=0.6, head_norm=2.0, seed=1)
    assert model.W.shape == (3, 12) and model.V.shape == (4, 3)
    assert torch.allclose(model.W @ model.W.T, torch.eye(3, dtype=model.W.dtype), atol=1e-12)
    assert torch.allclose(model.V.norm(dim=1), torch.full((4,), 2.0, dtype=model.V.dtype))
    assert model.noise_floor == pytest.approx(0.12)
    noisy, clean = model.sample([5, 6, 7, 8], generator("s", 0))
    assert noisy.sizes == [5, 6, 7, 8]
    assert all(torch.equal(a, b) for a, b in zip(noisy.X, clean.X, strict=True))
    z = torch.cat(noisy.y) - torch.cat(clean.y)
    assert z.abs().max() <= 0.6 and z.abs().max() > 0
    assert all(((y > 0) & (y < 1)).all() for y in clean.y)
    assert torch.allclose(noisy.X[0].norm(dim=1), torch.full((5,), 12**0.5, dtype=z.dtype))
    # exact frozen rows, and a perturbation orthogonal to the row space of W*
    assert torch.equal(model.frozen(2), model.W[:2])
    delta = model.frozen(2, 0.5) - model.W[:2]
    assert torch.allclose(delta @ model.W.T, torch.zeros(2, 3, dtype=z.dtype), atol=1e-12)
    assert torch.allclose(delta.norm(dim=1), torch.full((2,), 0.5, dtype=z.dtype))
    # same seed, same draw
    again, _ = model.sample([5, 6, 7, 8], generator("s", 0))
    assert torch.equal(again.y[3], noisy.y[3])


def test_planted_model_rejects_bad_values():
    with pytest.raises(
        TheoryConfigError, match=r"activation: got 'tanh'; accepted: identity, relu"
    ):
        PlantedModel.create(5, 2, 2, activation="tanh")
    model = PlantedModel.create(5, 2, 2)
    with pytest.raises(TheoryConfigError, match=r"r_frz: must be in \[0, r=2\], got 3"):
        model.frozen(3)
    with pytest.raises(TheoryConfigError, match=r"ns: every N must be >= 1, got 0"):
        model.sample(0, generator(0))


# ----------------------------------------------------------------------------- solver


def test_solver_recovers_planted_model_noise_free_from_scratch():
    model = PlantedModel.create(10, 3, 4, activation="identity", noise=0.5, seed=3)
    _, clean = model.sample(150, generator("train", 3))
    sol = solve_crl(clean, 3, None, bounds(model, "identity"))
    assert sol.W.shape == (3, 10) and sol.V.shape == (4, 3)
    assert sol.train_loss < 1e-8
    assert excess(model, sol.predict) < 1e-6
    # the learned rows span the planted row space (identity: up to an invertible map)
    proj = sol.W @ torch.linalg.pinv(model.W) @ model.W
    assert torch.allclose(proj, sol.W, atol=1e-3)


def test_solver_recovers_missing_rows_on_top_of_frozen_relu_features():
    model = PlantedModel.create(10, 4, 4, activation="relu", noise=0.5, seed=4)
    _, clean = model.sample(300, generator("train", 4))
    W_frz = model.frozen(3)
    sol = solve_crl(clean, 1, W_frz, bounds(model, "relu"))
    assert torch.equal(sol.W[:3], W_frz)  # frozen rows never move
    assert excess(model, sol.predict) < 1e-4


def test_solver_is_deterministic_and_validates():
    model = PlantedModel.create(8, 2, 3, activation="relu", seed=5)
    noisy, _ = model.sample(40, generator("train", 5))
    cfg = bounds(model, "relu", restarts=2, max_iter=60, seed=7)
    a, b = solve_crl(noisy, 2, None, cfg), solve_crl(noisy, 2, None, cfg)
    assert torch.equal(a.W, b.W) and torch.equal(a.V, b.V)
    # the best screened start is the one finished, and finishing only improves it
    assert len(a.restart_objectives) == 2
    assert a.restart_objectives[a.restart] == min(a.restart_objectives)
    assert a.objective <= a.restart_objectives[a.restart] + 1e-12
    with pytest.raises(TheoryConfigError, match=r"^activation: "):
        solve_crl(noisy, 1, None, SolverConfig(activation="gelu"))
    with pytest.raises(TheoryConfigError, match=r"^restarts: "):
        solve_crl(noisy, 1, None, SolverConfig(restarts=0))


def test_norm_bounds_hold_through_the_penalty():
    model = PlantedModel.create(8, 2, 3, activation="identity", seed=6)
    noisy, _ = model.sample(100, generator("train", 6))
    cfg = SolverConfig(activation="identity", head_bound=0.5, rep_bound=0.8, max_iter=200)
    sol = solve_crl(noisy, 2, None, cfg)
    assert float(sol.V.norm(dim=1).max()) <= 0.5 * 1.01
    assert float(sol.W_new.norm()) <= 0.8 * 1.01
    assert float(sol.V.norm(dim=1).max()) > 0.45  # the bound binds: the truth needs 2.5


def test_frozen_features_beat_scratch_with_few_samples():
    """r_new = 1 << r = 4, N*T = 240: 6.7x the frozen dof (36) but 2.5x scratch's (96)."""
    frozen_risk, scratch_risk = [], []
    for seed in range(2):
        model = PlantedModel.create(20, 4, 4, activation="identity", noise=0.5, seed=seed)
        noisy, _ = model.sample(60, generator("train", seed))
        cfg = bounds(model, "identity", max_iter=150)
        frozen_risk.append(excess(model, solve_crl(noisy, 1, model.frozen(3), cfg).predict))
        scratch_risk.append(excess(model, solve_crl(noisy, 4, None, cfg).predict))
    assert sum(frozen_risk) < 0.5 * sum(scratch_risk), (frozen_risk, scratch_risk)
    assert all(f < s for f, s in zip(frozen_risk, scratch_risk, strict=True))


def test_mismatch_floor_is_never_beaten():
    """On a perturbed W_frz the excess risk stays above the mismatch MM (up to noise)."""
    model = PlantedModel.create(12, 3, 4, activation="identity", noise=0.5, seed=8)
    W_frz = model.frozen(2, perturbation=0.5, seed=1)
    cfg = bounds(model, "identity", max_iter=150)
    _, big_clean = model.sample(1500, generator("mm", 8))
    mm = excess(model, solve_crl(big_clean, 1, W_frz, cfg).predict)
    assert mm > 5e-3  # the perturbation really costs something
    # and exact frozen rows cost nothing
    assert excess(model, solve_crl(big_clean, 1, model.frozen(2), cfg).predict) < 1e-6
    noisy, _ = model.sample(400, generator("train", 8))
    risks = [excess(model, solve_crl(noisy.head(n), 1, W_frz, cfg).predict) for n in (25, 100, 400)]
    assert min(risks) >= mm * 0.9 - 1e-4, (risks, mm)
    assert risks[-1] < 2.0 * mm  # it does level off near MM


def test_sequential_rows_are_frozen_and_accumulate():
    model = PlantedModel.create(10, 3, 6, activation="relu", noise=0.3, seed=9)
    noisy, _ = model.sample([200, 200, 100, 100, 30, 30], generator("train", 9))
    cfg = bounds(model, "relu", restarts=2, max_iter=80)
    arrivals: list[int] = []
    result = solve_sequential(
        noisy, [[0, 1], [2, 3], [4, 5]], [3, 1, 1], None, cfg, on_arrival=arrivals.append
    )
    assert arrivals == [0, 1, 2] and result.final_rows == 5
    assert [result.W[t].shape[0] for t in range(6)] == [3, 3, 4, 4, 5, 5]
    # zero forgetting: each arrival's rows are a prefix of every later representation
    assert torch.equal(result.W[4][:3], result.W[0]) and torch.equal(result.W[4][:4], result.W[2])
    assert all(result.heads[t].shape == (result.W[t].shape[0],) for t in range(6))
    with pytest.raises(TheoryConfigError, match="exactly once"):
        solve_sequential(noisy, [[0, 1], [2, 3], [4, 4]], [3, 1, 1], None, cfg)


# ----------------------------------------------------------------------------- summaries


def test_crossing_interpolates_in_log_log():
    curve = [(100.0, 0.1), (1000.0, 0.001)]
    assert crossing(curve, 0.01) == pytest.approx(math.sqrt(100 * 1000))
    assert crossing(curve, 0.5) == 100.0
    assert crossing(curve, 1e-4) is None


def test_sample_complexity_summary_on_exact_rate_rows():
    rows = []
    for r_frz, dof in ((0, 400), (7, 100)):
        for nt in (100, 1000, 10000):
            row = {"r_frz": r_frz, "r_new": 8 - r_frz, "dof": dof, "NT": nt}
            rows.append({**row, "excess_risk": 0.2 * dof / nt})
    assert fit_rate_constant(rows) == pytest.approx(0.2)
    summary = summarize_sample_complexity(rows, 0.01)
    scratch, frozen = summary["settings"]
    assert scratch["nt_needed"] == pytest.approx(8000) and frozen["nt_needed"] == pytest.approx(
        2000
    )
    assert frozen["ratio_measured"] == pytest.approx(4.0) == frozen["ratio_predicted"]
    assert frozen["excess_ratio_at_max_nt"] == pytest.approx(4.0)


def test_mismatch_and_task_order_summaries():
    rows = [
        {"setting": "frozen", "perturbation": 0.5, "NT": nt, "excess_risk": e, "noise_floor": 0.08}
        for nt, e in ((10, 0.3), (100, 0.05), (1000, 0.021))
    ] + [
        {"setting": s, "perturbation": 0.5, "NT": 10**4, "excess_risk": 0.02, "noise_floor": 0.08}
        for s in ("mm-train", "mm-test")
    ]
    p = summarize_mismatch(rows)["perturbations"][0]
    assert (
        p["mm_test"] == 0.02 and p["floor"] == 0.021 and p["floor_over_mm"] == pytest.approx(1.05)
    )
    order_rows = [
        {
            "order": o,
            "task_id": i,
            "N": n,
            "excess_risk": e * i,
            "test_risk": 0.1,
            "noise_floor": 0.08,
        }
        for o, e in (("decreasing", 1.0), ("increasing", 2.0))
        for i, n in ((1, 100), (2, 10))
    ]
    s = summarize_task_order(order_rows)
    assert s["sizes"] == [100, 10]
    dec, inc = s["orders"]
    assert dec["average_excess"] == 1.5 and inc["large_tasks_excess"] == 2.0


def test_config_validation_messages():
    with pytest.raises(TheoryConfigError, match=r"r_frz: each value must be in \[0, r=8\], got 9"):
        SampleComplexityConfig(r_frz=(9,)).validate()
    with pytest.raises(TheoryConfigError, match=r"ns: every N must be >= 1, got -2"):
        SampleComplexityConfig(ns=(4, -2)).validate()
    with pytest.raises(TheoryConfigError, match=r"orders: got 'random'"):
        TaskOrderConfig(orders=("random",)).validate()
    assert TaskOrderConfig(tasks=20, n_max=2500, n_min=125).sizes[-1] == 125
    assert TaskOrderConfig(tasks=20, n_max=2500, n_min=125).sizes[1] == math.floor(
        2500 * (1 / 20) ** (1 / 19)
    )


def test_experiment_rows_are_reproducible():
    cfg = SampleComplexityConfig(
        d=8, r=2, tasks=3, r_frz=(1,), ns=(10, 40), replicates=1, n_test=100, max_iter=40
    )
    ticks: list[int] = []
    first = run_sample_complexity(cfg, ticks.append)
    second = run_sample_complexity(cfg)
    assert len(ticks) == len(first) == 4
    keys = ("setting", "N", "train_loss", "excess_risk", "test_risk")
    assert [[r[k] for k in keys] for r in first] == [[r[k] for k in keys] for r in second]
