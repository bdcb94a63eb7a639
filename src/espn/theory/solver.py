"""The CRL solver of the shallow-network model, jointly over T tasks or task by task, by
full-batch L-BFGS in float64 (docs/theory.md); every draw is seeded, so a solve is deterministic."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from espn.theory.config import TheoryConfigError, at_least, check_choice, check_ns
from espn.theory.planted import DTYPE, TaskData, activation_fn, derive_seed, generator

INITS = ("spectral", "random")


@dataclass(frozen=True)
class SolverConfig:
    """Settings of :func:`solve_crl`: the activation, ``restarts`` starts (0: spectral, unless
    ``init`` is random) screened by ``screen_iter`` L-BFGS iterations, the best one finished
    to ``max_iter``; the norm bounds (None: unbounded) and their penalty weight."""

    activation: str = "relu"
    restarts: int = 3
    max_iter: int = 300
    head_bound: float | None = None
    rep_bound: float | None = None
    penalty: float = 100.0
    init: str = "spectral"
    screen_iter: int = 40
    seed: int = 0
    threads: int = 1

    def validate(self) -> SolverConfig:
        """Raise :class:`TheoryConfigError` on a setting that is not accepted."""
        activation_fn(self.activation)
        check_choice("init", self.init, INITS)
        at_least("restarts", self.restarts, 1)
        at_least("threads", self.threads, 0)
        at_least("screen_iter", self.screen_iter, 0)
        at_least("max_iter", self.max_iter, 1)
        for name, bound in (
            ("head bound", self.head_bound),
            ("representation bound", self.rep_bound),
        ):
            if bound is not None and bound <= 0:
                raise TheoryConfigError(f"{name}: must be > 0 or None, got {bound:g}")
        return self


@dataclass
class CRLSolution:
    """A solved CRL problem: representation ``W = [W_frz; W_new]`` and one head per task."""

    W_frz: torch.Tensor
    W_new: torch.Tensor
    V: torch.Tensor
    activation: str
    train_loss: float
    objective: float
    restart: int
    restart_objectives: list[float] = field(default_factory=list)

    @property
    def W(self) -> torch.Tensor:
        """The full representation used by every task of this solve."""
        return torch.cat([self.W_frz, self.W_new], dim=0)

    def predict(self, X: torch.Tensor, task: int) -> torch.Tensor:
        """``sigma(v_t^T psi(W x))`` for each row of ``X``."""
        return predict(self.W, self.V[task], X, self.activation)


def predict(W: torch.Tensor, v: torch.Tensor, X: torch.Tensor, activation: str) -> torch.Tensor:
    """Prediction of the shallow network with representation ``W`` and head ``v``."""
    return torch.sigmoid(activation_fn(activation)(X @ W.T) @ v)


def _spectral_directions(
    data: TaskData, W_frz: torch.Tensor, k: int, gen: torch.Generator
) -> torch.Tensor:
    """``k`` orthonormal rows: top moment directions outside span(W_frz), then random.

    The first moments ``m_t = mean_i (y_ti - mean y_t) x_ti`` lie approximately (Stein's
    lemma, spherical inputs) in the row space of ``W*``, so they estimate the missing rows."""
    d = data.X[0].shape[1]
    moments = torch.stack(
        [((y - y.mean())[:, None] * X).mean(0) for X, y in zip(data.X, data.y, strict=True)],
        dim=1,
    )  # d x T
    basis = torch.linalg.qr(W_frz.T)[0] if W_frz.shape[0] else torch.zeros(d, 0, dtype=DTYPE)
    moments = moments - basis @ (basis.T @ moments)
    u, s, _ = torch.linalg.svd(moments, full_matrices=False)
    keep = int((s > 1e-8 * max(float(s.max()) if s.numel() else 0.0, 1e-300)).sum())
    dirs = u[:, : min(k, keep)]
    if dirs.shape[1] < k:  # fill with random directions orthogonal to what we have
        have = torch.cat([basis, dirs], dim=1)
        extra = torch.randn(d, k - dirs.shape[1], generator=gen, dtype=DTYPE)
        extra = extra - have @ (have.T @ extra)
        dirs = torch.cat([dirs, torch.linalg.qr(extra)[0]], dim=1)
    return dirs.T.contiguous()


def _initial_rows(
    spectral: torch.Tensor | None, restart: int, r_new: int, d: int, gen: torch.Generator
) -> torch.Tensor:
    """Unit-norm starting rows of restart ``restart``: with a spectral estimate, restart 0 it
    as is, odd restarts a rotated and noised copy, other even ones random rows; else random."""
    random_rows = torch.randn(r_new, d, generator=gen, dtype=DTYPE)
    if spectral is None or (restart > 0 and restart % 2 == 0):
        W0 = random_rows
    elif restart == 0:
        W0 = spectral.clone()
    else:
        rotation = torch.linalg.qr(torch.randn(r_new, r_new, generator=gen, dtype=DTYPE))[0]
        W0 = rotation @ spectral + 0.5 * random_rows / d**0.5
    return W0 / W0.norm(dim=1, keepdim=True).clamp_min(1e-12)


def _init_heads(
    feats: list[torch.Tensor], ys: list[torch.Tensor], bound: float | None
) -> torch.Tensor:
    """Ridge fit of the linearised logits ``4 (y - 1/2)`` on the features, per task."""
    heads = []
    for F, y in zip(feats, ys, strict=True):
        gram = F.T @ F + 1e-3 * len(y) * torch.eye(F.shape[1], dtype=DTYPE)
        v = torch.linalg.solve(gram, F.T @ (4 * (y - 0.5)))
        if bound is not None and v.norm() > bound:
            v = v * (bound / v.norm())
        heads.append(v)
    return torch.stack(heads)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with ``n`` torch CPU threads (0: unchanged), then restore the old count (these
    problems are small: more threads mostly add synchronisation, hence the default 1)."""
    old = torch.get_num_threads()
    if n and n != old:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != old:
            torch.set_num_threads(old)


def solve_crl(
    data: TaskData,
    r_new: int,
    W_frz: torch.Tensor | None = None,
    config: SolverConfig | None = None,
) -> CRLSolution:
    """Learn ``r_new`` new rows and one head per task on top of the frozen ``W_frz`` (None or
    no rows: from scratch); each task's mean loss counts equally, whatever its size."""
    config = (config or SolverConfig()).validate()
    with torch_threads(config.threads):
        return _solve_crl(data, r_new, W_frz, config)


def _solve_crl(
    data: TaskData, r_new: int, W_frz: torch.Tensor | None, config: SolverConfig
) -> CRLSolution:
    at_least("r_new", r_new, 0)
    if not data.X:
        raise TheoryConfigError("need at least one task")
    check_ns(data.sizes)
    d = data.X[0].shape[1]
    W_frz = torch.zeros(0, d, dtype=DTYPE) if W_frz is None else W_frz.to(DTYPE)
    if W_frz.shape[0] + r_new < 1:
        raise TheoryConfigError("the representation needs at least one row (r_frz + r_new >= 1)")
    psi = activation_fn(config.activation)
    T = len(data.X)
    X_all = torch.cat(data.X)
    y_all = torch.cat(data.y)
    task_of = torch.cat([torch.full((n,), t, dtype=torch.long) for t, n in enumerate(data.sizes)])
    weight = torch.cat([torch.full((n,), 1.0 / (T * n), dtype=DTYPE) for n in data.sizes])
    F_frz = psi(X_all @ W_frz.T)  # frozen features never change: compute once

    def data_loss(W_new: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        F = torch.cat([F_frz, psi(X_all @ W_new.T)], dim=1)
        pred = torch.sigmoid((F * V[task_of]).sum(1))
        return (weight * (y_all - pred) ** 2).sum()

    def run_lbfgs(W_new: torch.Tensor, V: torch.Tensor, iters: int) -> float:
        return _lbfgs(
            lambda: data_loss(W_new, V) + _penalty(W_new, V, config),
            [V, W_new] if r_new else [V],
            iters,
        )

    # screen every start with a short run, then finish the best one
    starts = _starts(data, W_frz, r_new, config)
    screen = min(config.screen_iter, config.max_iter) if config.restarts > 1 else 0
    objectives = [run_lbfgs(W0, V0, screen) for W0, V0 in starts] if screen else [0.0]
    restart = min(range(len(objectives)), key=objectives.__getitem__)
    W_new, V = starts[restart]
    if config.max_iter > screen:
        objective = run_lbfgs(W_new, V, config.max_iter - screen)
    else:
        objective = objectives[restart]
    with torch.no_grad():
        train = float(data_loss(W_new, V))
    return CRLSolution(
        W_frz=W_frz.clone(),
        W_new=W_new.detach().clone(),
        V=V.detach().clone(),
        activation=config.activation,
        train_loss=train,
        objective=objective,
        restart=restart,
        restart_objectives=objectives if screen else [objective],
    )


def _starts(
    data: TaskData, W_frz: torch.Tensor, r_new: int, config: SolverConfig
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(W_new, V)`` start of every restart, both requiring grad (``W_new`` when
    ``r_new > 0``); rows within ``rep_bound``, heads fitted on the start's features."""
    psi = activation_fn(config.activation)
    d = data.X[0].shape[1]
    gen = generator("solve", config.seed, W_frz.shape[0], r_new, len(data.X), tuple(data.sizes))
    spectral = _spectral_directions(data, W_frz, r_new, gen) if config.init == "spectral" else None
    X_all, starts = torch.cat(data.X), []
    for restart in range(config.restarts):
        W0 = _initial_rows(spectral, restart, r_new, d, gen)
        if config.rep_bound is not None and r_new and W0.norm() > config.rep_bound:
            W0 = W0 * (config.rep_bound / W0.norm())
        # a ReLU unit that is dead on every sample gets no gradient: flip its sign
        if config.activation == "relu" and r_new:
            dead = (X_all @ W0.T > 0).sum(0) == 0
            W0[dead] = -W0[dead]
        feats = [psi(X @ torch.cat([W_frz, W0]).T) for X in data.X]
        V0 = _init_heads(feats, data.y, config.head_bound)
        starts.append((W0.requires_grad_(r_new > 0), V0.requires_grad_(True)))
    return starts


def _penalty(W_new: torch.Tensor, V: torch.Tensor, config: SolverConfig) -> torch.Tensor:
    """The exterior penalty of the norm bounds (zero on the feasible set)."""
    total = torch.zeros((), dtype=DTYPE)
    if config.head_bound is not None:
        total = total + (torch.relu((V**2).sum(1) - config.head_bound**2) ** 2).sum()
    if config.rep_bound is not None and W_new.shape[0]:
        total = total + torch.relu((W_new**2).sum() - config.rep_bound**2) ** 2
    return config.penalty * total


def _lbfgs(objective: Callable[[], torch.Tensor], params: list[torch.Tensor], iters: int) -> float:
    """Minimise ``objective()`` over ``params`` by ``iters`` L-BFGS iterations; its final value."""
    opt = torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=iters,
        max_eval=int(iters * 2.5),
        history_size=10,
        tolerance_grad=1e-10,
        tolerance_change=1e-13,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(objective())


@dataclass
class SequentialResult:
    """Task-by-task CRL: per task (in original indexing) its representation and head."""

    order: list[list[int]]
    W: dict[int, torch.Tensor]
    heads: dict[int, torch.Tensor]
    train_loss: dict[int, float]
    activation: str

    def predict(self, X: torch.Tensor, task: int) -> torch.Tensor:
        """Prediction of task ``task`` (rows learned up to and including its arrival)."""
        return predict(self.W[task], self.heads[task], X, self.activation)

    @property
    def final_rows(self) -> int:
        """Rows of the representation after the last arrival."""
        return self.W[self.order[-1][0]].shape[0]


def solve_sequential(
    data: TaskData,
    order: Sequence[int | Sequence[int]],
    new_rows: Sequence[int],
    W_frz: torch.Tensor | None = None,
    config: SolverConfig | None = None,
    on_arrival: Callable[[int], None] | None = None,
) -> SequentialResult:
    """CRL-SEQ: tasks arrive in ``order`` (an arrival: a task index, or a group of them, a
    multi-head task); the k-th learns its heads and ``new_rows[k]`` rows on top of ``W_frz``
    and every earlier arrival's rows, which stay frozen (zero forgetting, as in PackNet/ESPN).
    ``on_arrival(k)`` is called after the k-th arrival is solved (progress bars)."""

    config = (config or SolverConfig()).validate()
    groups = [[int(g)] if isinstance(g, int) else [int(t) for t in g] for g in order]
    flat = sorted(t for g in groups for t in g)
    if flat != list(range(len(data.X))):
        raise TheoryConfigError(
            f"order must use every task 0..{len(data.X) - 1} exactly once, got {groups}"
        )
    if len(new_rows) != len(groups):
        raise TheoryConfigError(
            f"need one new-row count per arrival ({len(groups)}), got {len(new_rows)}"
        )
    d = data.X[0].shape[1]
    W = torch.zeros(0, d, dtype=DTYPE) if W_frz is None else W_frz.to(DTYPE).clone()
    reps: dict[int, torch.Tensor] = {}
    heads: dict[int, torch.Tensor] = {}
    losses: dict[int, float] = {}
    for step, (group, k) in enumerate(zip(groups, new_rows, strict=True)):
        sub = data.select(group)
        sol = solve_crl(sub, k, W, replace(config, seed=derive_seed(config.seed, "seq", step)))
        W = sol.W
        for j, task in enumerate(group):
            reps[task], heads[task] = W.clone(), sol.V[j].clone()
            losses[task] = float(((sol.predict(sub.X[j], j) - sub.y[j]) ** 2).mean())
        if on_arrival is not None:
            on_arrival(step)
    return SequentialResult(groups, reps, heads, losses, config.activation)
